//! How this job will be stopped, against how long it needs to stop well.
//!
//! A scheduler warns before it kills: SLURM's `--signal=[B:]SIG@SECONDS`
//! before the time limit (and SIGTERM then SIGKILL `KillWait` seconds
//! later), a container runtime's SIGTERM then SIGKILL after the grace
//! period (Kubernetes' `terminationGracePeriodSeconds`). The job must stop
//! at an agreed step and commit a checkpoint inside that window, so each
//! window is compared with the last checkpoint's save time (the manifest's
//! `save_seconds`, written by `relaunch.Checkpointer`). And the warning
//! must reach `relaunch run`: a shell as a container's PID 1 swallows
//! SIGTERM, and SLURM's `--signal` without `B:` never reaches a launcher
//! that is the batch shell itself.
//!
//! [`Stops::probe`] reads this process's situation; [`check`] is a pure
//! function of it.

use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

use super::{Finding, Level};

/// What the stop checks look at.
#[derive(Clone, Debug, Default)]
pub struct Stops {
    /// `SLURM_JOB_ID`, inside a SLURM job.
    pub slurm_job: Option<String>,
    /// `SLURM_STEP_ID`: set in an `srun` step, not in the batch shell.
    pub slurm_step: Option<String>,
    /// The job's batch script (`scontrol write batch_script JOB -`), or why
    /// it could not be read.
    pub batch_script: Option<Result<String, String>>,
    /// SLURM's `KillWait`: seconds from the time limit's SIGTERM to SIGKILL.
    pub kill_wait: Option<f64>,
    /// The job's time limit in seconds (`scontrol show job`'s `TimeLimit`,
    /// which counts sbatch's command line too); `None` when unlimited or unknown.
    pub time_limit: Option<f64>,
    /// The signals `relaunch run` stops on (torchrun's and, in SLURM, SIGUSR1).
    pub stop_signals: Vec<Signal>,
    /// The container runtime, when this looks like a container.
    pub container: Option<&'static str>,
    /// The grace period from SIGTERM to SIGKILL, as given (`--grace-period`
    /// or `RELAUNCH_GRACE_PERIOD`): no runtime shows it to the container.
    pub grace_period: Option<f64>,
    /// PID 1's name (`/proc/1/comm`) and arguments (`/proc/1/cmdline`).
    pub pid1: Option<(String, Vec<String>)>,
    /// The newest committed checkpoint in `--ckpt-dir`, or why there is none.
    pub last_save: Option<Result<LastSave, String>>,
}

/// The newest committed checkpoint and how long its save took.
#[derive(Clone, Debug, PartialEq)]
pub struct LastSave {
    pub path: PathBuf,
    pub step: u64,
    pub seconds: f64,
}

/// SLURM's `--signal` as the batch script gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmSignal {
    /// The text, as written (`B:USR1@90`).
    pub spec: String,
    pub signal: Signal,
    /// Seconds before the time limit (SLURM's default: 60).
    pub lead: f64,
    /// `B:`: only the batch shell is signalled (else only the job steps).
    pub batch_shell: bool,
}

impl Stops {
    /// This process's situation; `ckpt_dir` is where the job's checkpoints are.
    pub fn probe(ckpt_dir: Option<&Path>, grace_period: Option<f64>) -> Self {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let slurm_job = env("SLURM_JOB_ID");
        let mut stop_signals =
            crate::config::parse_signals(crate::config::DEFAULT_SIGNALS).unwrap_or_default();
        let (mut batch_script, mut kill_wait, mut time_limit) = (None, None, None);
        if let Some(job) = &slurm_job {
            stop_signals.push(Signal::SIGUSR1);
            batch_script = Some(
                command_output("scontrol", &["write", "batch_script", job, "-"])
                    .map_err(|e| format!("`scontrol write batch_script {job} -`: {e}")),
            );
            kill_wait = command_output("scontrol", &["show", "config"])
                .ok()
                .and_then(|config| kill_wait_of(&config));
            time_limit = command_output("scontrol", &["show", "job", job])
                .ok()
                .and_then(|show| time_limit_of(&show));
        }
        let container = if env("KUBERNETES_SERVICE_HOST").is_some() {
            Some("Kubernetes")
        } else if Path::new("/.dockerenv").exists() {
            Some("Docker")
        } else if Path::new("/run/.containerenv").exists() {
            Some("Podman")
        } else {
            None
        };
        let pid1 = std::fs::read_to_string("/proc/1/comm").ok().map(|comm| {
            let args = std::fs::read("/proc/1/cmdline")
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|arg| !arg.is_empty())
                        .map(|arg| String::from_utf8_lossy(arg).into_owned())
                        .collect()
                })
                .unwrap_or_default();
            (comm.trim().to_owned(), args)
        });
        Self {
            slurm_step: env("SLURM_STEP_ID"),
            slurm_job,
            batch_script,
            kill_wait,
            time_limit,
            stop_signals,
            container,
            grace_period,
            pid1,
            last_save: ckpt_dir.map(last_save),
        }
    }
}

/// A command's standard output, or why there is none.
fn command_output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{} ({})", err.trim(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `KillWait = 30 sec` from `scontrol show config`.
fn kill_wait_of(config: &str) -> Option<f64> {
    config.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "KillWait").then(|| value.split_whitespace().next()?.parse().ok())?
    })
}

/// `TimeLimit=1-02:03:04` (or `02:03:04`, `03:04`, `UNLIMITED`) from
/// `scontrol show job`, in seconds.
fn time_limit_of(show: &str) -> Option<f64> {
    let value = show
        .split_whitespace()
        .find_map(|field| field.strip_prefix("TimeLimit="))?;
    let (days, clock) = match value.split_once('-') {
        Some((days, clock)) => (days.parse::<u64>().ok()?, clock),
        None => (0, value),
    };
    let mut seconds = 0u64;
    for part in clock.split(':') {
        seconds = seconds * 60 + part.parse::<u64>().ok()?;
    }
    Some((days * 86_400 + seconds) as f64)
}

/// The newest committed checkpoint (`step_N/manifest.json`) in `dir`.
pub fn last_save(dir: &Path) -> Result<LastSave, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let newest = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step: u64 = name.strip_prefix("step_")?.parse().ok()?;
            let manifest = e.path().join("manifest.json");
            manifest.is_file().then_some((step, manifest))
        })
        .max_by_key(|(step, _)| *step);
    let Some((step, manifest)) = newest else {
        return Err(format!("no committed checkpoint in {}", dir.display()));
    };
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", manifest.display()))?;
    let seconds = json
        .get("save_seconds")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| {
            format!(
                "{} has no save_seconds (saved by a relaunch older than 0.1.0)",
                manifest.display()
            )
        })?;
    Ok(LastSave {
        path: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        step,
        seconds,
    })
}

/// The last `--signal` among the batch script's `#SBATCH` lines (sbatch
/// reads them until the first line that is neither blank nor a comment).
/// `Ok(None)`: there is none; `Err`: one that SLURM would not accept either.
pub fn slurm_signal(script: &str) -> Result<Option<SlurmSignal>, String> {
    let mut found = None;
    for line in script.lines().skip(1) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some(options) = line.strip_prefix("#SBATCH") else {
            continue;
        };
        let mut tokens = options.split_whitespace();
        while let Some(token) = tokens.next() {
            if let Some(spec) = token.strip_prefix("--signal=") {
                found = Some(spec.to_owned());
            } else if token == "--signal" {
                found = tokens.next().map(str::to_owned);
            }
        }
    }
    found.map(|spec| parse_slurm_signal(&spec)).transpose()
}

/// `[{R|B}:]SIG[@SECONDS]`, as sbatch reads it.
pub fn parse_slurm_signal(spec: &str) -> Result<SlurmSignal, String> {
    let bad = |why: &str| format!("--signal={spec}: {why} (the form is [{{R|B}}:]SIG[@SECONDS])");
    let (flags, rest) = match spec.split_once(':') {
        Some((flags, rest)) => (flags, rest),
        None => ("", spec),
    };
    if !flags.chars().all(|c| matches!(c, 'R' | 'B' | 'r' | 'b')) {
        return Err(bad(&format!("{flags:?} is not R or B")));
    }
    let (name, lead) = match rest.split_once('@') {
        Some((name, seconds)) => {
            let lead: u32 = seconds
                .parse()
                .map_err(|_| bad(&format!("{seconds:?} is not a whole number of seconds")))?;
            (name, f64::from(lead))
        }
        None => (rest, 60.0),
    };
    let signal = match name.parse::<i32>() {
        Ok(number) => Signal::try_from(number).map_err(|_| bad("no such signal number"))?,
        Err(_) => {
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            full.parse()
                .map_err(|_| bad(&format!("{name:?} is not a signal")))?
        }
    };
    Ok(SlurmSignal {
        spec: spec.to_owned(),
        signal,
        lead,
        batch_shell: flags.contains(['B', 'b']),
    })
}

/// Every stop check that applies here.
pub fn check(stops: &Stops) -> Vec<Finding> {
    let mut findings = Vec::new();
    if stops.slurm_job.is_some() {
        findings.push(check_slurm(stops));
    }
    if stops.container.is_some() || stops.grace_period.is_some() {
        findings.push(check_grace_period(stops));
    }
    if let Some(finding) = check_pid1(stops) {
        findings.push(finding);
    }
    if let Some(Err(why)) = &stops.last_save {
        findings.push(
            Finding::new("last checkpoint", Level::Warn, why.clone()).fix(
                "point --ckpt-dir at the directory the job's relaunch.Checkpointer writes, \
                 after it has committed a checkpoint",
            ),
        );
    }
    findings
}

/// How a window compares with the last save: a finding's level and words.
fn against_last_save(window: f64, what: &str, stops: &Stops) -> (Level, String) {
    match &stops.last_save {
        Some(Ok(save)) if save.seconds >= window => (
            Level::Fail,
            format!(
                "{what}, but the last checkpoint (step {}) took {:.1} s to save: the job is \
                 killed before it commits",
                save.step, save.seconds
            ),
        ),
        Some(Ok(save)) if save.seconds * 2.0 > window => (
            Level::Warn,
            format!(
                "{what}, and the last checkpoint (step {}) took {:.1} s to save: less than \
                 twice that is left, so a slower save (a busier file system) is killed",
                save.step, save.seconds
            ),
        ),
        Some(Ok(save)) => (
            Level::Ok,
            format!(
                "{what}; the last checkpoint (step {}) took {:.1} s to save",
                save.step, save.seconds
            ),
        ),
        _ => (
            Level::Info,
            format!("{what} (give --ckpt-dir to compare it with the last checkpoint's save)"),
        ),
    }
}

/// A window that leaves twice the last save's time, rounded up.
fn enough(stops: &Stops, floor: f64) -> f64 {
    match &stops.last_save {
        Some(Ok(save)) => (save.seconds * 2.0).ceil().max(floor),
        _ => floor,
    }
}

fn check_slurm(stops: &Stops) -> Finding {
    const CHECK: &str = "slurm stop warning";
    let kill_wait = stops.kill_wait.unwrap_or(30.0);
    let script = match &stops.batch_script {
        Some(Ok(script)) => script,
        Some(Err(why)) => {
            return Finding::new(
                CHECK,
                Level::Info,
                format!("the batch script could not be read ({why}), so its --signal is unknown"),
            );
        }
        None => return Finding::new(CHECK, Level::Info, "not in a batch job"),
    };
    let signal = match slurm_signal(script) {
        Ok(Some(signal)) => signal,
        Ok(None) => {
            let what = format!(
                "no #SBATCH --signal in the batch script: at the time limit SLURM sends SIGTERM \
                 and SIGKILL {kill_wait:.0} s later (KillWait; a --signal given on sbatch's \
                 command line is not visible from inside the job)"
            );
            let (level, found) = against_last_save(kill_wait, &what, stops);
            let level = level.max(Level::Info);
            let lead = enough(stops, 90.0);
            return Finding::new(CHECK, level, found).fix(format!(
                "add `#SBATCH --signal=B:USR1@{lead:.0}` (and `#SBATCH --requeue`) so relaunch \
                 stops at an agreed step, checkpoints and requeues before the limit"
            ));
        }
        Err(why) => return Finding::new(CHECK, Level::Fail, why),
    };
    if !stops.stop_signals.contains(&signal.signal) {
        return Finding::new(
            CHECK,
            Level::Fail,
            format!(
                "--signal={} sends {}, which relaunch run does not stop on",
                signal.spec, signal.signal
            ),
        )
        .fix(format!(
            "use --signal=B:USR1@{:.0}, or add {} to relaunch run --signals-to-handle",
            signal.lead, signal.signal
        ));
    }
    if let Some(limit) = stops.time_limit.filter(|limit| signal.lead >= *limit) {
        return Finding::new(
            CHECK,
            Level::Fail,
            format!(
                "--signal={} asks for the warning {:.0} s before the time limit, but the job's \
                 whole time limit is {limit:.0} s: SLURM sends it within a minute of the start, \
                 so the job stops as soon as it starts (and, requeued, every time)",
                signal.spec, signal.lead
            ),
        )
        .fix(format!(
            "give the job a time limit well over {:.0} s (--time), or a --signal lead well \
             under {limit:.0} s",
            signal.lead
        ));
    }
    if !signal.batch_shell && stops.slurm_step.is_none() {
        return Finding::new(
            CHECK,
            Level::Warn,
            format!(
                "--signal={} has no B:, so SLURM signals the job steps and not the batch shell: \
                 a relaunch run started by the batch script itself (not through srun) never \
                 sees it",
                signal.spec
            ),
        )
        .fix(format!(
            "use --signal=B:{}@{:.0} (examples/slurm/train.sbatch)",
            signal.signal.as_str().trim_start_matches("SIG"),
            signal.lead
        ));
    }
    let what = format!(
        "--signal={} warns {:.0} s before the time limit",
        signal.spec, signal.lead
    );
    let (level, found) = against_last_save(signal.lead, &what, stops);
    let finding = Finding::new(CHECK, level, found);
    if level >= Level::Warn {
        let lead = enough(stops, signal.lead);
        finding.fix(format!(
            "warn earlier: --signal={}{}@{lead:.0}",
            if signal.batch_shell { "B:" } else { "" },
            signal.signal.as_str().trim_start_matches("SIG")
        ))
    } else {
        finding
    }
}

fn check_grace_period(stops: &Stops) -> Finding {
    const CHECK: &str = "grace period";
    let runtime = stops.container.unwrap_or("the container runtime");
    let Some(grace) = stops.grace_period else {
        let default = match stops.container {
            Some("Kubernetes") => "30 s unless the pod sets terminationGracePeriodSeconds",
            Some("Docker") => "10 s unless `docker stop -t` or --stop-timeout says otherwise",
            _ => "the runtime's",
        };
        return Finding::new(
            CHECK,
            Level::Info,
            format!(
                "{runtime} does not show the container its grace period from SIGTERM to \
                 SIGKILL ({default})"
            ),
        )
        .fix(
            "set RELAUNCH_GRACE_PERIOD to the same number of seconds (examples/kubernetes/ \
             does) so that this check can compare it with the last checkpoint's save",
        );
    };
    let what = format!("{runtime} kills {grace:.0} s after its SIGTERM (the grace period)");
    let (level, found) = against_last_save(grace, &what, stops);
    let finding = Finding::new(CHECK, level, found);
    if level >= Level::Warn {
        finding.fix(format!(
            "give the pod terminationGracePeriodSeconds: {:.0} (and RELAUNCH_GRACE_PERIOD \
             the same), or save less at a stop",
            enough(stops, grace)
        ))
    } else {
        finding
    }
}

/// PID 1: only a problem when it is a process that lets SIGTERM die with it.
fn check_pid1(stops: &Stops) -> Option<Finding> {
    const CHECK: &str = "pid 1";
    let (comm, args) = stops.pid1.as_ref()?;
    let shown = if args.is_empty() {
        comm.clone()
    } else {
        args.join(" ")
    };
    let name = comm.as_str();
    const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "ksh", "busybox"];
    const FORWARDERS: &[&str] = &[
        "tini",
        "dumb-init",
        "catatonit",
        "docker-init",
        "s6-svscan",
        "runsvdir",
        "supervisord",
    ];
    let finding = if name == "relaunch" || runs_relaunch(args) {
        Finding::new(
            CHECK,
            Level::Ok,
            format!(
                "relaunch is PID 1 ({shown}): it passes SIGTERM to every rank and reaps every \
                 orphan"
            ),
        )
    } else if name == "systemd" || name == "init" || FORWARDERS.contains(&name) {
        Finding::new(
            CHECK,
            Level::Ok,
            format!("PID 1 is {name}, which passes signals on"),
        )
    } else if SHELLS.contains(&name) {
        Finding::new(
            CHECK,
            Level::Warn,
            format!(
                "PID 1 is a shell ({shown}): a shell that is running a command does not pass \
                 SIGTERM on, so the job gets no warning and is SIGKILLed at the end of the \
                 grace period"
            ),
        )
        .fix(
            "make relaunch PID 1: `exec relaunch run ...` at the end of the entrypoint script, \
             or relaunch run as the container's command",
        )
    } else if name.starts_with("python") {
        Finding::new(
            CHECK,
            Level::Warn,
            format!(
                "PID 1 is Python ({shown}): the kernel gives PID 1 no default signal actions, \
                 so SIGTERM does nothing unless the program handles it, and nothing reaps \
                 the orphans of DataLoader workers"
            ),
        )
        .fix("start the job with relaunch run as the container's command")
    } else {
        Finding::new(CHECK, Level::Info, format!("PID 1 is {shown}"))
    };
    Some(finding)
}

/// Whether a command line runs relaunch: the `relaunch` script (directly
/// or through its interpreter, as a `#!` script's command line reads) or
/// `python -m relaunch`.
fn runs_relaunch(args: &[String]) -> bool {
    let base = |arg: &str| arg.rsplit('/').next().unwrap_or(arg).to_owned();
    args.iter().take(2).any(|arg| base(arg) == "relaunch")
        || args
            .windows(2)
            .take(2)
            .any(|pair| pair[0] == "-m" && pair[1] == "relaunch")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(seconds: f64) -> Option<Result<LastSave, String>> {
        Some(Ok(LastSave {
            path: PathBuf::from("/ckpt/step_00000100"),
            step: 100,
            seconds,
        }))
    }

    fn slurm(script: &str, last: Option<Result<LastSave, String>>) -> Stops {
        Stops {
            slurm_job: Some("42".into()),
            batch_script: Some(Ok(script.into())),
            kill_wait: Some(30.0),
            stop_signals: vec![Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1],
            last_save: last,
            ..Stops::default()
        }
    }

    fn only(stops: &Stops, check: &str) -> Finding {
        let found: Vec<_> = super::check(stops)
            .into_iter()
            .filter(|f| f.check == check)
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found.into_iter().next().unwrap()
    }

    #[test]
    fn signal_specs_parse_as_sbatch_reads_them() {
        let s = parse_slurm_signal("B:USR1@90").unwrap();
        assert_eq!(
            (s.signal, s.lead, s.batch_shell),
            (Signal::SIGUSR1, 90.0, true)
        );
        let s = parse_slurm_signal("SIGUSR2").unwrap();
        assert_eq!(
            (s.signal, s.lead, s.batch_shell),
            (Signal::SIGUSR2, 60.0, false)
        );
        let s = parse_slurm_signal("RB:10@300").unwrap();
        assert_eq!(
            (s.signal, s.lead, s.batch_shell),
            (Signal::SIGUSR1, 300.0, true)
        );
        assert_eq!(
            parse_slurm_signal("term@5").unwrap().signal,
            Signal::SIGTERM
        );
        for bad in ["X:USR1@9", "USR1@soon", "NOPE@9", "99@9", "USR1@-5"] {
            let err = parse_slurm_signal(bad).unwrap_err();
            assert!(err.starts_with(&format!("--signal={bad}:")), "{err}");
        }
    }

    #[test]
    fn only_the_sbatch_lines_before_the_first_command_count() {
        let script = "#!/bin/bash\n#SBATCH --time=1:00:00\n\n# note\n#SBATCH --signal=B:USR1@30 --requeue\n#SBATCH --signal USR1@120\necho hi\n#SBATCH --signal=USR2@5\n";
        let s = slurm_signal(script).unwrap().unwrap();
        assert_eq!((s.spec.as_str(), s.lead), ("USR1@120", 120.0));
        let none = "#!/bin/bash\necho start\n#SBATCH --signal=B:USR1@30\n";
        assert_eq!(slurm_signal(none).unwrap(), None);
        assert!(slurm_signal("#!/bin/sh\n#SBATCH --signal=B:USR1@x\n").is_err());
    }

    #[test]
    fn a_lead_shorter_than_the_last_save_fails() {
        let script = "#!/bin/bash\n#SBATCH --signal=B:USR1@30\n";
        let f = only(&slurm(script, save(45.2)), "slurm stop warning");
        assert_eq!(f.level, Level::Fail, "{f:?}");
        assert!(
            f.found.contains("45.2 s") && f.found.contains("30 s"),
            "{}",
            f.found
        );
        assert_eq!(f.fix.as_deref(), Some("warn earlier: --signal=B:USR1@91"));
        let f = only(&slurm(script, save(20.0)), "slurm stop warning");
        assert_eq!(f.level, Level::Warn, "{f:?}");
        let f = only(&slurm(script, save(10.0)), "slurm stop warning");
        assert_eq!((f.level, f.fix), (Level::Ok, None));
        let f = only(&slurm(script, None), "slurm stop warning");
        assert_eq!(f.level, Level::Info);
        assert!(f.found.contains("--ckpt-dir"), "{}", f.found);
    }

    #[test]
    fn a_signal_relaunch_ignores_or_that_misses_the_batch_shell_is_named() {
        let f = only(
            &slurm("#!/bin/bash\n#SBATCH --signal=B:USR2@90\n", save(1.0)),
            "slurm stop warning",
        );
        assert_eq!(f.level, Level::Fail);
        assert!(f.found.contains("SIGUSR2"), "{}", f.found);
        let mut stops = slurm("#!/bin/bash\n#SBATCH --signal=USR1@90\n", save(1.0));
        let f = only(&stops, "slurm stop warning");
        assert_eq!(f.level, Level::Warn);
        assert!(f.found.contains("no B:"), "{}", f.found);
        assert_eq!(
            f.fix.as_deref(),
            Some("use --signal=B:USR1@90 (examples/slurm/train.sbatch)")
        );
        stops.slurm_step = Some("0".into());
        assert_eq!(only(&stops, "slurm stop warning").level, Level::Ok);
    }

    #[test]
    fn a_lead_as_long_as_the_time_limit_fails() {
        // The real-SLURM doctor test had --signal=USR1@600 and --time=5:
        // SLURM signalled its step at the first check after the start.
        let mut stops = slurm("#!/bin/bash\n#SBATCH --signal=B:USR1@600\n", save(1.0));
        stops.time_limit = Some(300.0);
        let f = only(&stops, "slurm stop warning");
        assert_eq!(f.level, Level::Fail, "{f:?}");
        assert!(
            f.found.contains("600 s before") && f.found.contains("limit is 300 s"),
            "{}",
            f.found
        );
        assert!(f.fix.unwrap().contains("--time"));
        stops.time_limit = Some(600.0);
        assert_eq!(only(&stops, "slurm stop warning").level, Level::Fail);
        stops.time_limit = Some(601.0);
        assert_eq!(only(&stops, "slurm stop warning").level, Level::Ok);
        stops.time_limit = None;
        assert_eq!(only(&stops, "slurm stop warning").level, Level::Ok);
    }

    #[test]
    fn the_time_limit_is_read_from_scontrol_show_job() {
        let show = |limit: &str| {
            format!("JobId=7 JobName=job.sh\n   RunTime=00:00:03 TimeLimit={limit} TimeMin=N/A\n")
        };
        assert_eq!(time_limit_of(&show("00:05:00")), Some(300.0));
        assert_eq!(time_limit_of(&show("1-02:03:04")), Some(93_784.0));
        assert_eq!(time_limit_of(&show("05:00")), Some(300.0));
        assert_eq!(time_limit_of(&show("UNLIMITED")), None);
        assert_eq!(time_limit_of(&show("Partition_Limit")), None);
        assert_eq!(time_limit_of("JobId=7"), None);
    }

    #[test]
    fn without_a_signal_the_kill_wait_is_the_window() {
        let f = only(
            &slurm("#!/bin/bash\nsrun x\n", save(40.0)),
            "slurm stop warning",
        );
        assert_eq!(f.level, Level::Fail);
        assert!(f.found.contains("KillWait"), "{}", f.found);
        assert_eq!(
            f.fix.as_deref(),
            Some(
                "add `#SBATCH --signal=B:USR1@90` (and `#SBATCH --requeue`) so relaunch stops at an agreed step, checkpoints and requeues before the limit"
            )
        );
        let f = only(&slurm("#!/bin/bash\nsrun x\n", None), "slurm stop warning");
        assert_eq!(f.level, Level::Info);
    }

    #[test]
    fn the_grace_period_is_compared_when_it_is_known() {
        let mut stops = Stops {
            container: Some("Kubernetes"),
            last_save: save(25.0),
            ..Stops::default()
        };
        let f = only(&stops, "grace period");
        assert_eq!(f.level, Level::Info);
        assert!(f.found.contains("30 s"), "{}", f.found);
        stops.grace_period = Some(30.0);
        let f = only(&stops, "grace period");
        assert_eq!(f.level, Level::Warn);
        assert!(f.fix.unwrap().contains("terminationGracePeriodSeconds: 50"));
        stops.grace_period = Some(20.0);
        assert_eq!(only(&stops, "grace period").level, Level::Fail);
        stops.grace_period = Some(120.0);
        assert_eq!(only(&stops, "grace period").level, Level::Ok);
        // Outside a container with no grace period given: no such check.
        assert!(super::check(&Stops::default()).is_empty());
    }

    #[test]
    fn pid_1_is_judged_by_whether_it_passes_sigterm_on() {
        let level_of = |comm: &str, args: &[&str]| {
            let stops = Stops {
                pid1: Some((comm.into(), args.iter().map(|a| a.to_string()).collect())),
                ..Stops::default()
            };
            only(&stops, "pid 1").level
        };
        let level = |comm: &str| level_of(comm, &[comm, "-c", "train"]);
        // The console script (a `#!` script: comm is its name) and
        // `python -m relaunch run` (comm is the interpreter's).
        let script = ["/venv/bin/python3", "/venv/bin/relaunch", "run", "t.py"];
        assert_eq!(level_of("relaunch", &script), Level::Ok);
        assert_eq!(
            level_of("python3", &["/usr/bin/python3", "-m", "relaunch", "run"]),
            Level::Ok
        );
        assert_eq!(
            level_of("python3", &["python3", "train.py", "-m", "relaunch"]),
            Level::Warn
        );
        assert_eq!(level("relaunch"), Level::Ok);
        assert_eq!(level("tini"), Level::Ok);
        assert_eq!(level("systemd"), Level::Ok);
        assert_eq!(level("bash"), Level::Warn);
        assert_eq!(level("python3.12"), Level::Warn);
        assert_eq!(level("process_api"), Level::Info);
    }

    #[test]
    fn the_last_save_is_read_from_the_newest_committed_checkpoint() {
        let dir = std::env::temp_dir().join(format!("relaunch-doctor-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            last_save(&dir)
                .unwrap_err()
                .contains(&dir.display().to_string())
        );
        std::fs::create_dir_all(dir.join("step_00000010")).unwrap();
        std::fs::create_dir_all(dir.join("step_00000030.tmp-x")).unwrap();
        std::fs::create_dir_all(dir.join("step_00000020")).unwrap();
        assert!(
            last_save(&dir)
                .unwrap_err()
                .starts_with("no committed checkpoint")
        );
        std::fs::write(
            dir.join("step_00000010/manifest.json"),
            r#"{"save_seconds": 3.5}"#,
        )
        .unwrap();
        std::fs::write(dir.join("step_00000020/manifest.json"), r#"{"step": 20}"#).unwrap();
        assert!(last_save(&dir).unwrap_err().contains("no save_seconds"));
        std::fs::write(
            dir.join("step_00000020/manifest.json"),
            r#"{"save_seconds": 7.25}"#,
        )
        .unwrap();
        let got = last_save(&dir).unwrap();
        assert_eq!((got.step, got.seconds), (20, 7.25));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kill_wait_is_read_from_scontrol_show_config() {
        let config = "Configuration data as of 2026-11-25T13:34:03\nJobAcctGatherType       = (null)\nKillWait                = 45 sec\nKillOnBadExit           = 0\n";
        assert_eq!(kill_wait_of(config), Some(45.0));
        assert_eq!(kill_wait_of("KillOnBadExit = 0\n"), None);
    }
}
