//! Shell completions and man pages, generated from the clap definitions in
//! [`crate::cli`], so they never drift from `--help`. Hidden subcommands
//! (tools for the test suite and for packaging) are left out of both. The
//! man pages end with FILES (what the .deb installs that the command
//! reads or serves) and SEE ALSO (the other pages, and the installed docs
//! the page names).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, ShellArg};

/// The command line as users see it: `Cli` without its hidden
/// subcommands. clap cannot remove a subcommand, and clap_complete writes
/// hidden ones too, so the top level is rebuilt from the visible parts.
fn documented_command() -> clap::Command {
    let full = Cli::command();
    let mut cmd = clap::Command::new("rtprobe")
        .version(env!("CARGO_PKG_VERSION"))
        .args_conflicts_with_subcommands(true)
        .args(full.get_arguments().cloned())
        .groups(full.get_groups().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(a) = full.get_about() {
        cmd = cmd.about(a.clone());
    }
    if let Some(a) = full.get_long_about() {
        cmd = cmd.long_about(a.clone());
    }
    if let Some(a) = full.get_after_help() {
        cmd = cmd.after_help(a.clone());
    }
    cmd
}

/// The completion script for `shell`. Built in memory: clap_complete
/// panics on a write error, and stdout may be a closed pipe.
pub(super) fn completions(shell: ShellArg) -> Vec<u8> {
    use clap_complete::Shell;
    let shell = match shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
    };
    let mut cmd = documented_command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "rtprobe", &mut out);
    out
}

/// Writes `rtprobe.1` and one page per visible subcommand
/// (`rtprobe-plot.1`, ...) into `dir`, created if missing, and returns
/// their paths, the top-level page first.
pub(super) fn write_man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create {}: check the path", dir.display()))?;
    // As clap_mangen::generate_to: `help` is no page of its own.
    let mut cmd = documented_command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    let mut pages = vec![cmd.clone()];
    pages.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    let names: Vec<String> = pages.iter().map(page_name).collect();
    for page in pages {
        let name = page_name(&page);
        let man = clap_mangen::Man::new(page);
        let path = dir.join(man.get_filename());
        let mut text = Vec::new();
        man.render(&mut text)
            .with_context(|| format!("cannot render {}", path.display()))?;
        let others: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != name && (name == "rtprobe" || *n == "rtprobe"))
            .collect();
        // The top page lists every installed doc; the others those they name.
        let named = if name == "rtprobe" {
            SHIPPED_DOCS.map(String::from).to_vec()
        } else {
            named_docs(&String::from_utf8_lossy(&text))
        };
        text.extend(files_section(&name).into_bytes());
        text.extend(see_also_section(&others, &named).into_bytes());
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}: check the permissions", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Where the .deb puts the docs and the deploy/ examples
/// (prober/Cargo.toml's `[package.metadata.deb]` assets).
const DOC_DIR: &str = "/usr/share/doc/rtprobe";
const SHARE_DIR: &str = "/usr/share/rtprobe";

/// The docs the package ships in [`DOC_DIR`]: those a page names (the
/// unit test checks both lists) and those an operator follows.
const SHIPPED_DOCS: [&str; 7] = [
    "README.md",
    "DEPLOY.md",
    "FLEET.md",
    "RUNBOOK.md",
    "REMOTE.md",
    "CONTINUOUS.md",
    "OUTPUTS.md",
];

/// "rtprobe" or "rtprobe-SUB", as the page's file is named.
fn page_name(page: &clap::Command) -> String {
    match page.get_name() {
        "rtprobe" => "rtprobe".into(),
        sub => format!("rtprobe-{sub}"),
    }
}

/// The installed files a page's reader needs: (path, what it is).
fn files_of(page: &str) -> Vec<(String, &'static str)> {
    let etc = [
        (
            "/etc/rtprobe/targets.toml".to_string(),
            "The targets rtprobe-mesh.service probes (the --targets format); rtprobe targets --host writes it from a fleet inventory.",
        ),
        (
            "/etc/default/rtprobe".into(),
            "The units' options: RTPROBE_REFLECT_OPTS, RTPROBE_METRICS_LISTEN, RTPROBE_MESH_OPTS.",
        ),
    ];
    let units = (
        "/usr/lib/systemd/system/rtprobe-reflect.service, rtprobe-mesh.service".to_string(),
        "The reflector and the mesh prober, neither enabled on install.",
    );
    let kernel = (
        format!("{DOC_DIR}/examples/rtprobe-reflect-kernel.conf"),
        "The drop-in for the in-kernel reflector (--kernel).",
    );
    let prometheus = (
        format!("{SHARE_DIR}/prometheus/"),
        "Prometheus' scrape config (file_sd from rtprobe targets --prometheus-sd), the recording and alerting rules and their tests.",
    );
    let others = [
        (
            format!("{SHARE_DIR}/alertmanager/alertmanager.yml"),
            "Alertmanager's routing and the inhibition of the pair alerts a host-down alert explains.",
        ),
        (
            format!("{SHARE_DIR}/grafana/rtprobe-fleet.json"),
            "A Grafana dashboard: the pair matrix and per-pair RTT histograms.",
        ),
        (
            format!("{DOC_DIR}/examples/rtprobe-daemonset.yaml"),
            "The same on Kubernetes.",
        ),
    ];
    match page {
        "rtprobe" => etc
            .into_iter()
            .chain([units, kernel, prometheus])
            .chain(others)
            .collect(),
        "rtprobe-reflect" => vec![etc[1].clone(), units, kernel],
        "rtprobe-targets" => vec![etc[0].clone(), prometheus],
        _ => Vec::new(),
    }
}

/// The docs a page's text names (`docs/REMOTE.md`), in order.
fn named_docs(page_text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, _) in page_text.match_indices("docs/") {
        let rest = &page_text[i + 5..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(rest.len());
        let name = rest[..end].trim_end_matches('.');
        if name.ends_with(".md") && !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    out
}

/// Text for roff: a backslash and a hyphen are escaped.
fn roff(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

fn files_section(page: &str) -> String {
    let files = files_of(page);
    if files.is_empty() {
        return String::new();
    }
    let mut s = String::from(".SH FILES\n");
    for (path, what) in files {
        s += &format!(".TP\n\\fI{}\\fR\n{}\n", roff(&path), roff(what));
    }
    s
}

/// The other pages (`rtprobe-plot(1)`...), then the installed docs: those
/// the page names, then the README and the deployment guide.
fn see_also_section(pages: &[&str], named: &[String]) -> String {
    let refs: Vec<String> = pages
        .iter()
        .map(|p| format!("\\fB{}\\fR(1)", roff(p)))
        .collect();
    let mut docs: Vec<&str> = named.iter().map(String::as_str).collect();
    for d in ["README.md", "DEPLOY.md"] {
        if !docs.contains(&d) {
            docs.push(d);
        }
    }
    let docs: Vec<String> = docs
        .iter()
        .map(|d| format!("\\fI{}\\fR", roff(&format!("{DOC_DIR}/{d}"))))
        .collect();
    format!(
        ".SH \"SEE ALSO\"\n{}\n.PP\n{}\n",
        refs.join(", "),
        docs.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand a user can type.
    fn visible_subcommands() -> Vec<String> {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect();
        assert!(names.len() >= 4, "{names:?}");
        names
    }

    #[test]
    fn documented_command_is_cli_without_hidden_subcommands() {
        let mut cmd = documented_command();
        cmd.build();
        let subs: Vec<&str> = cmd
            .get_subcommands()
            .map(|s| s.get_name())
            .filter(|n| *n != "help")
            .collect();
        assert_eq!(subs, visible_subcommands());
        assert!(!subs.contains(&"testbed") && !subs.contains(&"man"));
        for flag in ["xdp-mode", "interval", "verbose"] {
            assert!(
                cmd.get_arguments().any(|a| a.get_long() == Some(flag)),
                "{flag}"
            );
        }
        let help = cmd.render_long_help().to_string();
        assert!(
            help.contains("Examples:") && help.contains("Needs root"),
            "{help}"
        );
    }

    #[test]
    fn completion_scripts_name_every_visible_subcommand_and_key_flags() {
        for shell in [ShellArg::Bash, ShellArg::Zsh, ShellArg::Fish] {
            let script = String::from_utf8(completions(shell)).unwrap();
            assert!(script.len() > 1000, "{shell:?}: {script}");
            // How each script offers a subcommand name.
            let offers = |name: &str| match shell {
                ShellArg::Bash => script.contains(&format!("rtprobe,{name})")),
                ShellArg::Zsh => script.contains(&format!("\n'{name}:")),
                ShellArg::Fish => script.contains(&format!("-a \"{name}\" -d")),
            };
            for sub in visible_subcommands() {
                assert!(offers(&sub), "{shell:?} script does not offer {sub}");
            }
            assert!(
                !offers("testbed") && !offers("man"),
                "{shell:?} offers hidden ones"
            );
            // fish spells long flags without the dashes (-l xdp-mode).
            for flag in ["xdp-mode", "interval", "group-by", "out-dir", "native"] {
                assert!(script.contains(flag), "{shell:?} script lacks {flag}");
            }
        }
    }

    #[test]
    fn man_pages_exist_for_the_command_and_every_visible_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man");
        let written = write_man_pages(&out).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let subs = visible_subcommands();
        assert_eq!(names.len(), subs.len() + 1, "{names:?}");
        assert_eq!(names[0], "rtprobe.1");
        let top = std::fs::read_to_string(&written[0]).unwrap();
        assert!(top.starts_with(".ie") || top.contains(".TH"), "{top}");
        for sub in &subs {
            let page = out.join(format!("rtprobe-{sub}.1"));
            assert!(page.is_file(), "no page for {sub}: {names:?}");
            // roff writes a hyphen as \-.
            let roff = sub.replace('-', "\\-");
            assert!(top.contains(&roff), "rtprobe.1 does not mention {sub}");
        }
        assert!(top.contains("xdp\\-mode"), "{top}");
        assert!(!out.join("rtprobe-testbed.1").exists());
        assert!(!out.join("rtprobe-help.1").exists());
        let plot = std::fs::read_to_string(out.join("rtprobe-plot.1")).unwrap();
        assert!(plot.contains("group\\-by"), "{plot}");
        // FILES and SEE ALSO, after everything clap wrote.
        assert!(
            top.contains(".SH FILES") && top.contains("/etc/rtprobe/targets.toml"),
            "{top}"
        );
        assert!(
            top.contains(".SH \"SEE ALSO\"\n\\fBrtprobe\\-plot\\fR(1)"),
            "{top}"
        );
        assert!(!plot.contains(".SH FILES"), "{plot}");
        assert!(plot.contains("\\fBrtprobe\\fR(1)\n.PP\n"), "{plot}");
        let targets = std::fs::read_to_string(out.join("rtprobe-targets.1")).unwrap();
        assert!(
            targets.contains("/usr/share/rtprobe/prometheus/"),
            "{targets}"
        );
    }

    /// Every doc a page names is installed, and every installed doc is an
    /// asset of the package.
    #[test]
    fn the_docs_the_pages_name_are_shipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut named = Vec::new();
        for page in write_man_pages(dir.path()).unwrap() {
            let text = std::fs::read_to_string(&page).unwrap();
            for d in named_docs(&text) {
                assert!(
                    SHIPPED_DOCS.contains(&d.as_str()),
                    "{} names docs/{d}, which the package does not ship",
                    page.display()
                );
                assert!(
                    text.contains(&format!("\\fI/usr/share/doc/rtprobe/{d}\\fR")),
                    "{}: {d} not in SEE ALSO",
                    page.display()
                );
                named.push(d);
            }
        }
        assert!(named.iter().any(|d| d == "REMOTE.md"), "{named:?}");
        let manifest =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        for d in SHIPPED_DOCS {
            let src = if d == "README.md" {
                "\"../README.md\"".to_string()
            } else {
                format!("\"../docs/{d}\"")
            };
            let asset = format!("[{src}, \"usr/share/doc/rtprobe/\", \"644\"]");
            assert!(
                manifest.contains(&asset),
                "prober/Cargo.toml does not ship {d}: add {asset}"
            );
        }
        assert_eq!(
            named_docs("see docs/REMOTE.md. and docs/A_B.md, docs/x"),
            ["REMOTE.md", "A_B.md"]
        );
    }
}
