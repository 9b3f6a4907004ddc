//! `cargo xtask man`: the man pages, written by rtprobe itself.

use std::{env, path::Path, process::Command};

use anyhow::Result;

use crate::{cargo, run, workspace_root};

/// The pages come from rtprobe itself (its hidden `man` subcommand), where
/// the clap definitions live: xtask must build without rtprobe's eBPF
/// toolchain, since `cargo xtask setup` is what installs it.
fn man_command(root: &Path, out_dir: Option<&Path>) -> Command {
    let out_dir = match out_dir {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        // Relative to where the user typed it, not to the workspace.
        Some(d) => env::current_dir().map_or_else(|_| d.to_path_buf(), |c| c.join(d)),
        None => root.join("target/man"),
    };
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args([
            "run",
            "--quiet",
            "--package",
            "rtprobe",
            "--",
            "man",
            "--out-dir",
        ])
        .arg(out_dir);
    cmd
}

pub(crate) fn man(out_dir: Option<&Path>) -> Result<()> {
    run(&mut man_command(&workspace_root(), out_dir))
}

#[cfg(test)]
mod tests {
    use std::env;

    use super::*;

    #[test]
    fn man_runs_rtprobe_man_into_the_chosen_dir() {
        let root = Path::new("/ws");
        let args = |c: &Command| -> Vec<String> {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let c = man_command(root, None);
        assert_eq!(c.get_current_dir(), Some(root));
        let a = args(&c);
        assert_eq!(a[..4], ["run", "--quiet", "--package", "rtprobe"]);
        assert_eq!(a[4..], ["--", "man", "--out-dir", "/ws/target/man"]);
        let a = args(&man_command(root, Some(Path::new("/tmp/pages"))));
        assert_eq!(a.last().map(String::as_str), Some("/tmp/pages"));
        let a = args(&man_command(root, Some(Path::new("pages"))));
        let cwd = env::current_dir().unwrap();
        assert_eq!(a.last(), Some(&cwd.join("pages").display().to_string()));
    }
}
