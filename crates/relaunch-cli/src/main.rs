//! The `relaunch` binary: everything lives in the `relaunch_cli` library.

fn main() -> std::process::ExitCode {
    // `python -m relaunch` execs this binary and names its interpreter,
    // which `relaunch run` starts workers with (see `Context::python`).
    let python = std::env::var_os(relaunch_cli::PYTHON_ENV).filter(|p| !p.is_empty());
    if python.is_some() {
        // Not passed on to the workers, whose environment is torchrun's.
        // SAFETY: no other thread exists yet, so none can read the
        // environment while it changes (the only hazard of remove_var).
        #[allow(unsafe_code)]
        unsafe {
            std::env::remove_var(relaunch_cli::PYTHON_ENV);
        }
    }
    let context = relaunch_cli::Context { python };
    std::process::ExitCode::from(relaunch_cli::run_to_code(std::env::args_os(), &context))
}
