//! `relaunch run --print-completion SHELL`: a completion script for the
//! whole `relaunch` command, as torchrun prints one for itself. clap_complete
//! writes bash, zsh, fish, elvish and PowerShell; tcsh, which torchrun also
//! offers and clap_complete does not, gets subcommands and flags from the
//! same clap definition.

use std::collections::BTreeSet;

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;

/// The completion script for `shell` (one of the names `--print-completion`
/// accepts).
pub(crate) fn script(shell: &str) -> Result<String, String> {
    let mut command = Cli::command();
    let name = command.get_name().to_owned();
    let shell = match shell {
        "tcsh" => return Ok(tcsh(&command)),
        "bash" => Shell::Bash,
        "zsh" => Shell::Zsh,
        "fish" => Shell::Fish,
        "elvish" => Shell::Elvish,
        "powershell" => Shell::PowerShell,
        other => return Err(format!("--print-completion {other}: no such shell")),
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut out);
    String::from_utf8(out).map_err(|e| format!("the completion script is not UTF-8: {e}"))
}

/// tcsh's `complete`: the subcommands as the first word, and every long
/// flag of any subcommand after `--`.
fn tcsh(command: &clap::Command) -> String {
    let subcommands: Vec<&str> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(clap::Command::get_name)
        .collect();
    let mut flags = BTreeSet::new();
    let mut stack = vec![command];
    while let Some(c) = stack.pop() {
        for arg in c.get_arguments().filter(|a| !a.is_hide_set()) {
            flags.extend(arg.get_long_and_visible_aliases().into_iter().flatten());
        }
        stack.extend(c.get_subcommands());
    }
    let flags: Vec<&str> = flags.into_iter().collect();
    format!(
        "complete {} 'p/1/({})/' 'c/--/({})/'\n",
        command.get_name(),
        subcommands.join(" "),
        flags.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_that_names_run_and_its_flags() {
        for shell in ["bash", "zsh", "fish", "elvish", "powershell", "tcsh"] {
            let text = script(shell).unwrap();
            assert!(text.contains("relaunch"), "{shell}: {text}");
            assert!(text.contains("nproc-per-node"), "{shell}");
        }
        let tcsh = script("tcsh").unwrap();
        assert!(
            tcsh.starts_with("complete relaunch 'p/1/(run doctor server"),
            "{tcsh}"
        );
        assert!(script("csh").is_err());
    }
}
