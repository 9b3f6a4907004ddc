//! Shell completions and man pages, generated from the clap definitions in
//! [`crate::cli`], so they never drift from `--help`. Hidden subcommands
//! (tools for the test suite and for packaging) are left out of both.

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
    for page in pages {
        let man = clap_mangen::Man::new(page);
        let path = dir.join(man.get_filename());
        let mut text = Vec::new();
        man.render(&mut text)
            .with_context(|| format!("cannot render {}", path.display()))?;
        std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}: check the permissions", path.display()))?;
        written.push(path);
    }
    Ok(written)
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
    }
}
