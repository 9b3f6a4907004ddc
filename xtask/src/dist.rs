//! `cargo xtask dist`: the Debian package, built by cargo-deb from
//! prober/Cargo.toml's `[package.metadata.deb]`.
//!
//! The release binary carries its eBPF objects (prober/build.rs embeds
//! them), so the package is that one binary plus what rtprobe writes about
//! itself: the man pages (`rtprobe man`) and the shell completions
//! (`rtprobe completions SHELL`), staged in `target/dist/` where the
//! metadata's assets point; and the files of deploy/: the systemd units,
//! /etc/default/rtprobe and /etc/rtprobe/targets.toml (conffiles), the
//! examples. docs/DEPLOY.md describes the result.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{cargo, output_of, run, show, workspace_root};

/// The cargo-deb release `cargo xtask setup` and `dist` install (any patch
/// level): the metadata's keys (`systemd-units` with `unit-name`) are its.
const CARGO_DEB_MINOR: &str = "3.8";
/// Where the generated assets go, relative to the workspace; the asset
/// paths in prober/Cargo.toml (`../target/dist/...`) name the same place.
const STAGING: &str = "target/dist";
/// Each shell `rtprobe completions` knows, and the file name its package
/// directory expects (bash-completion, zsh vendor-completions, fish).
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "rtprobe"),
    ("zsh", "_rtprobe"),
    ("fish", "rtprobe.fish"),
];

/// Builds the .deb and returns its path.
pub(crate) fn dist() -> Result<PathBuf> {
    setup_cargo_deb()?;
    let root = workspace_root();
    run(&mut release_build(&root))?;
    let bin = target_dir(&root).join("release/rtprobe");
    let staging = root.join(STAGING);
    stage_assets(&bin, &staging)?;
    let deb = cargo_deb(&root, &staging)?;
    eprintln!("xtask: dist: {}", deb.display());
    Ok(deb)
}

/// `cargo-deb 3.8.0` -> true when it is the pinned minor release.
fn cargo_deb_version_ok(version_line: &str) -> bool {
    version_line
        .split_whitespace()
        .nth(1)
        .is_some_and(|v| v.starts_with(&format!("{CARGO_DEB_MINOR}.")))
}

/// cargo-deb from the crate registry, at the pinned release, unless there.
pub(crate) fn setup_cargo_deb() -> Result<()> {
    let current = output_of("cargo-deb", &["--version"]);
    if let Some(v) = &current
        && cargo_deb_version_ok(v)
    {
        eprintln!("xtask: {v} present, skipped");
        return Ok(());
    }
    let version_req = format!("~{CARGO_DEB_MINOR}");
    run(Command::new(cargo()).args([
        "install",
        "cargo-deb",
        "--version",
        &version_req,
        "--locked",
        "--force",
    ]))
}

fn release_build(root: &Path) -> Command {
    let mut c = Command::new(cargo());
    c.current_dir(root)
        .args(["build", "--release", "--locked", "--package", "rtprobe"]);
    c
}

/// Cargo's target directory as cargo-deb will see it.
fn target_dir(root: &Path) -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

/// The man pages and completions, written by the binary being packaged so
/// they describe exactly its options.
fn stage_assets(bin: &Path, staging: &Path) -> Result<()> {
    if staging.exists() {
        std::fs::remove_dir_all(staging)
            .with_context(|| format!("cannot empty {}", staging.display()))?;
    }
    let man = staging.join("man");
    // It prints each page's path: stdout is the .deb's path alone.
    run(Command::new(bin)
        .arg("man")
        .arg("--out-dir")
        .arg(&man)
        .stdout(Stdio::null()))?;
    for page in ["rtprobe.1", "rtprobe-reflect.1"] {
        if !man.join(page).is_file() {
            bail!("`{} man` wrote no {page}", bin.display());
        }
    }
    let completions = staging.join("completions");
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("cannot create {}", completions.display()))?;
    for (shell, file) in COMPLETIONS {
        let mut cmd = Command::new(bin);
        cmd.args(["completions", shell]).stderr(Stdio::inherit());
        let out = cmd
            .output()
            .with_context(|| format!("cannot run {}", show(&cmd)))?;
        if !out.status.success() || out.stdout.is_empty() {
            bail!("`{}` failed ({})", show(&cmd), out.status);
        }
        let path = completions.join(file);
        std::fs::write(&path, &out.stdout)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn cargo_deb_command(root: &Path, staging: &Path) -> Command {
    let mut c = Command::new(cargo());
    c.current_dir(root)
        .args(["deb", "--package", "rtprobe", "--no-build", "--output"])
        .arg(staging)
        .stdout(Stdio::piped());
    c
}

/// Runs cargo-deb over the staged assets; its last line on stdout is the
/// package's path.
fn cargo_deb(root: &Path, staging: &Path) -> Result<PathBuf> {
    let mut cmd = cargo_deb_command(root, staging);
    eprintln!("xtask: running {}", show(&cmd));
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", show(&cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", show(&cmd), out.status);
    }
    deb_path(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("`{}` named no .deb", show(&cmd)))
}

fn deb_path(stdout: &str) -> Option<PathBuf> {
    stdout
        .lines()
        .map(str::trim)
        .rfind(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn cargo_deb_version_check() {
        assert!(cargo_deb_version_ok("cargo-deb 3.8.0"));
        assert!(cargo_deb_version_ok("cargo-deb 3.8.11"));
        assert!(!cargo_deb_version_ok("cargo-deb 3.7.0"));
        assert!(!cargo_deb_version_ok("cargo-deb 3.80.0"));
        assert!(!cargo_deb_version_ok("cargo-deb"));
    }

    #[test]
    fn packages_the_release_build_without_rebuilding_it() {
        let b = release_build(Path::new("/ws"));
        assert_eq!(
            args_of(&b),
            ["build", "--release", "--locked", "--package", "rtprobe"]
        );
        let d = cargo_deb_command(Path::new("/ws"), Path::new("/ws/target/dist"));
        assert_eq!(d.get_current_dir(), Some(Path::new("/ws")));
        assert_eq!(
            args_of(&d),
            [
                "deb",
                "--package",
                "rtprobe",
                "--no-build",
                "--output",
                "/ws/target/dist"
            ]
        );
    }

    #[test]
    fn the_deb_path_is_the_last_deb_line() {
        let out = "warning: x\n/ws/target/dist/rtprobe_0.1.0-1_amd64.deb\n";
        assert_eq!(
            deb_path(out),
            Some(PathBuf::from("/ws/target/dist/rtprobe_0.1.0-1_amd64.deb"))
        );
        assert_eq!(deb_path("nothing built\n"), None);
    }

    /// The metadata's asset paths and the staging directory must agree,
    /// and every file it packages from the tree must exist.
    #[test]
    fn the_metadata_names_the_staged_and_deploy_files() {
        let root = workspace_root();
        let manifest = std::fs::read_to_string(root.join("prober/Cargo.toml")).unwrap();
        for (_, file) in COMPLETIONS {
            let asset = format!("\"../{STAGING}/completions/{file}\"");
            assert!(manifest.contains(&asset), "no asset {asset}");
        }
        assert!(manifest.contains(&format!("\"../{STAGING}/man/*.1\"")));
        let mut tree_files = 0;
        for line in manifest.lines() {
            let Some(src) = line.trim().strip_prefix("[\"../") else {
                continue;
            };
            let src = src.split('"').next().unwrap();
            if src.starts_with(STAGING) {
                continue;
            }
            match src.rsplit_once("/*") {
                // cargo-deb's glob (`dir/*.yml`): at least one file.
                Some((dir, ext)) => {
                    let n = std::fs::read_dir(root.join(dir))
                        .unwrap()
                        .filter(|e| {
                            e.as_ref()
                                .unwrap()
                                .file_name()
                                .to_string_lossy()
                                .ends_with(ext)
                        })
                        .count();
                    assert!(n > 0, "asset {src} matches no file");
                }
                None => assert!(root.join(src).is_file(), "asset {src} missing"),
            }
            tree_files += 1;
        }
        assert!(tree_files >= 6, "{tree_files} files of the tree packaged");
        for unit in ["rtprobe-reflect", "rtprobe-mesh"] {
            assert!(manifest.contains(&format!("unit-name = \"{unit}\"")));
            assert!(
                root.join(format!("deploy/systemd/{unit}.service"))
                    .is_file(),
                "{unit}"
            );
        }
    }
}
