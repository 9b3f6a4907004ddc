//! What the unit tests of the commands xtask builds read back from a
//! `Command`.

use std::process::Command;

/// The command's arguments, as strings.
pub(crate) fn args_of(c: &Command) -> Vec<String> {
    c.get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The value the command sets for environment variable `key`, if any.
pub(crate) fn env_of(c: &Command, key: &str) -> Option<String> {
    c.get_envs()
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
}
