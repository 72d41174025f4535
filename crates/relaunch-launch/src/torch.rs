//! The workers' torch, looked up once per launch: which version it is, so
//! that the variables the launcher sets are the names that torch reads
//! without a deprecation warning on every rank.
//!
//! The version is read from the name of torch's installed metadata folder
//! (`torch-2.15.0.dist-info`) in the places the workers' Python imports from
//! (`PYTHONPATH`, then its prefix's `site-packages`/`dist-packages`): no
//! process is started. Only where that finds nothing certain, and the
//! workers are Python, is Python itself asked (tens of milliseconds).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::env::{TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE};

/// How long the launcher waits for the answer; a Python that takes longer
/// to start is taken as an unknown torch.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What `python -c '... importlib.metadata.version("torch")'` printed:
/// `2.15.0+cu132` gives `(2, 15)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TorchVersion {
    pub major: u32,
    pub minor: u32,
}

impl TorchVersion {
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split(['.', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Self { major, minor })
    }

    /// torch 2.7 moved the flight recorder out of ProcessGroupNCCL and
    /// renamed its size variable `TORCH_FR_BUFFER_SIZE`; later versions
    /// still read the old name but warn about it on every rank at
    /// `init_process_group`, gloo included. An unknown version (no torch,
    /// a Python that would not answer) gets the new name: only an NCCL
    /// process group reads it.
    pub fn flight_recorder_size_var(version: Option<Self>) -> &'static str {
        match version {
            Some(v) if v < Self { major: 2, minor: 7 } => TORCH_NCCL_TRACE_BUFFER_SIZE,
            _ => TORCH_FR_BUFFER_SIZE,
        }
    }
}

/// The version of the torch that `python` imports, without importing it
/// (its package metadata: tens of milliseconds). `None` when there is no
/// torch, or Python fails or takes longer than [`PROBE_TIMEOUT`].
pub async fn probe(python: &OsStr) -> Option<TorchVersion> {
    let output = tokio::process::Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('torch'))",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(PROBE_TIMEOUT, output).await {
        Ok(Ok(out)) if out.status.success() => {
            TorchVersion::parse(&String::from_utf8_lossy(&out.stdout))
        }
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            tracing::debug!(python = %python.to_string_lossy(), error = %e, "cannot ask python for its torch version");
            None
        }
        Err(_) => {
            tracing::debug!(python = %python.to_string_lossy(), "python took too long to say its torch version");
            None
        }
    }
}

/// The workers' torch version: from its metadata ([`from_metadata`]), else,
/// for Python workers only, from [`probe`]. For a task of its own.
pub async fn find(python: OsString, python_workers: bool) -> Option<TorchVersion> {
    let path = std::env::var_os("PATH");
    let pythonpath = std::env::var_os("PYTHONPATH");
    let lookup = (python.clone(), path, pythonpath);
    let found = tokio::task::spawn_blocking(move || {
        from_metadata(&lookup.0, lookup.1.as_deref(), lookup.2.as_deref())
    })
    .await
    .ok()
    .flatten();
    match found {
        Some(version) => Some(version),
        None if python_workers => probe(&python).await,
        None => None,
    }
}

/// The version in the name of the one `torch-VERSION.dist-info` folder
/// that `python` would import torch with: the first `PYTHONPATH` entry
/// that has one, else its prefix's (the folder above its `bin/`)
/// `lib/python3*/site-packages` or `dist-packages`, `lib/python3/
/// dist-packages` and `local/lib/python3*/dist-packages`. `None` when
/// `python` is not found, no folder has torch, or several disagree (a
/// prefix with more than one Python: only Python itself knows).
pub fn from_metadata(
    python: &OsStr,
    path: Option<&OsStr>,
    pythonpath: Option<&OsStr>,
) -> Option<TorchVersion> {
    for entry in pythonpath.map(std::env::split_paths).into_iter().flatten() {
        if let Some(version) = torch_in(&entry) {
            return version;
        }
    }
    let exe = locate(python, path)?;
    let prefix = exe.parent()?.parent()?;
    let mut dirs = vec![prefix.join("lib/python3/dist-packages")];
    for lib in [prefix.join("lib"), prefix.join("local/lib")] {
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("python3") {
                dirs.push(entry.path().join("site-packages"));
                dirs.push(entry.path().join("dist-packages"));
            }
        }
    }
    let mut found: Vec<TorchVersion> = dirs.iter().filter_map(|d| torch_in(d)).flatten().collect();
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// `Some(version)` when `dir` holds torch's metadata folder (`Some(None)`:
/// torch is there, its version unreadable), `None` when it holds no torch.
fn torch_in(dir: &Path) -> Option<Option<TorchVersion>> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(version) = name
            .strip_prefix("torch-")
            .and_then(|rest| rest.strip_suffix(".dist-info"))
        {
            return Some(TorchVersion::parse(version));
        }
    }
    None
}

/// `python` as the workers' exec finds it: a path as is, a bare name on
/// `PATH`. Not resolved through symbolic links: a virtual environment's
/// `bin/python` links to the base Python, but imports from the
/// environment.
fn locate(python: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    let python = Path::new(python);
    if python.components().count() > 1 {
        return python.is_file().then(|| python.to_path_buf());
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(python))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_choose_the_name_their_torch_reads_quietly() {
        let v = |text| TorchVersion::parse(text);
        assert_eq!(
            v("2.15.0+cu132"),
            Some(TorchVersion {
                major: 2,
                minor: 15
            })
        );
        assert_eq!(v("2.6.0"), Some(TorchVersion { major: 2, minor: 6 }));
        assert_eq!(
            v("2.8.0.dev20250101\n"),
            Some(TorchVersion { major: 2, minor: 8 })
        );
        assert_eq!(v("torch"), None);
        assert_eq!(v(""), None);
        let name = TorchVersion::flight_recorder_size_var;
        assert_eq!(name(v("2.15.0")), TORCH_FR_BUFFER_SIZE);
        assert_eq!(name(v("2.7.1")), TORCH_FR_BUFFER_SIZE);
        assert_eq!(name(v("2.6.0")), TORCH_NCCL_TRACE_BUFFER_SIZE);
        assert_eq!(name(v("1.13.1")), TORCH_NCCL_TRACE_BUFFER_SIZE);
        assert_eq!(name(None), TORCH_FR_BUFFER_SIZE);
    }

    /// A folder of its own under the system's temporary one, removed when
    /// dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("relaunch-torch-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn install(root: &Path, site: &str, version: &str) {
        std::fs::create_dir_all(root.join(site).join(format!("torch-{version}.dist-info")))
            .unwrap();
    }

    fn fake_python(root: &Path) -> PathBuf {
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let exe = root.join("bin/python3");
        std::fs::write(&exe, "").unwrap();
        exe
    }

    #[test]
    fn the_version_comes_from_the_environments_metadata_without_python() {
        let tmp = TempDir::new();
        let venv = tmp.path().join("venv");
        let exe = fake_python(&venv);
        install(&venv, "lib/python3.11/site-packages", "2.6.0+cpu");
        std::fs::create_dir_all(venv.join("lib/python3.11/site-packages/numpy-2.4.6.dist-info"))
            .unwrap();
        let two_six = Some(TorchVersion { major: 2, minor: 6 });
        assert_eq!(from_metadata(exe.as_os_str(), None, None), two_six);
        // A bare name is looked up on PATH.
        let path = std::env::join_paths([tmp.path().join("nowhere"), venv.join("bin")]).unwrap();
        assert_eq!(
            from_metadata(OsStr::new("python3"), Some(&path), None),
            two_six
        );
        assert_eq!(from_metadata(OsStr::new("python3"), None, None), None);
        // PYTHONPATH comes first.
        let extra = tmp.path().join("extra");
        install(&extra, "", "2.15.0");
        let pythonpath = std::env::join_paths([tmp.path().join("empty"), extra]).unwrap();
        assert_eq!(
            from_metadata(exe.as_os_str(), None, Some(&pythonpath)),
            Some(TorchVersion {
                major: 2,
                minor: 15
            })
        );
    }

    #[test]
    fn no_torch_or_two_pythons_that_disagree_give_no_version() {
        let tmp = TempDir::new();
        let exe = fake_python(tmp.path());
        assert_eq!(from_metadata(exe.as_os_str(), None, None), None);
        install(tmp.path(), "lib/python3.10/site-packages", "2.5.1");
        install(tmp.path(), "local/lib/python3.12/dist-packages", "2.5.0");
        // The same minor version in both: certain enough.
        assert_eq!(
            from_metadata(exe.as_os_str(), None, None),
            Some(TorchVersion { major: 2, minor: 5 })
        );
        install(tmp.path(), "lib/python3.12/site-packages", "2.8.0");
        assert_eq!(from_metadata(exe.as_os_str(), None, None), None);
        assert_eq!(
            from_metadata(tmp.path().join("missing").as_os_str(), None, None),
            None
        );
    }
}
