//! The `relaunch` binary: everything lives in the `relaunch_cli` library.

fn main() -> std::process::ExitCode {
    relaunch_cli::run(std::env::args_os())
}
