//! The memory tier of checkpoints (`relaunch run --snapshot-memory`): one
//! directory per launcher in a memory filesystem (`/dev/shm`), where
//! `relaunch.Checkpointer(memory_every=N)` keeps its snapshots, made before
//! the first attempt, kept across every restart and removed when the
//! launcher exits; what a killed launcher left, the next one sweeps.
//!
//! The directory is `ROOT/relaunch-snap-UID-PID-RANDOM`, mode 0700, with an
//! `owner` file (pid, the process's start time, run id, host, boot and pid
//! namespace) by which a later launcher tells a dead owner from a live one.

use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::config::SnapshotConfig;

mod budget;

pub use budget::{
    DEFAULT_ROOT, Decision, RootSpace, SNAPSHOT_ROOT_ENV, decide, default_budget, human,
    node_memory, parse_mem_total, root,
};

/// What every tier directory's name starts with.
const PREFIX: &str = "relaunch-snap-";
/// The file in a tier directory that names the launcher that owns it.
const OWNER_FILE: &str = "owner";
/// A directory without a readable owner file is left alone this long: its
/// launcher may be between its `mkdir` and writing the file.
const OWNERLESS_GRACE: Duration = Duration::from_secs(60 * 60);

/// Who owns a tier directory: what its `owner` file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: i32,
    /// The process's start time (`/proc/PID/stat` field 22, clock ticks
    /// since boot): with the pid, it names the process even once the pid
    /// is reused.
    pub start_time: u64,
    pub run_id: String,
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: a launcher of an earlier boot is
    /// gone, whatever its pid.
    #[serde(default)]
    pub boot_id: String,
    /// `/proc/self/ns/pid`: a pid of another namespace (a container sharing
    /// the root) cannot be looked up from here.
    #[serde(default)]
    pub pid_namespace: String,
}

/// Where this launcher runs, to judge owners by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Here {
    pub hostname: String,
    pub boot_id: String,
    pub pid_namespace: String,
}

impl Here {
    pub fn probe() -> Self {
        Self {
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|id| id.trim().to_owned())
                .unwrap_or_default(),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid")
                .map(|link| link.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// Why a tier directory is stale (its launcher is gone), or `None` to
/// leave it: its launcher lives, or may live, or is not ours to judge.
/// `age` is the time since the directory last changed; `start_time_of`
/// gives a live process's start time by pid ([`process_start_time`]).
pub fn stale(
    owner: Option<&Owner>,
    age: Duration,
    here: &Here,
    start_time_of: impl Fn(i32) -> Option<u64>,
) -> Option<&'static str> {
    let Some(owner) = owner else {
        return (age >= OWNERLESS_GRACE).then_some("no readable owner file, unchanged for an hour");
    };
    if owner.hostname != here.hostname {
        // Another machine's, on a shared filesystem: its pids are not ours.
        return None;
    }
    if !owner.boot_id.is_empty() && !here.boot_id.is_empty() && owner.boot_id != here.boot_id {
        return Some("its launcher ran before the machine's last boot");
    }
    if owner.pid_namespace != here.pid_namespace {
        return None;
    }
    match start_time_of(owner.pid) {
        None => Some("its launcher is gone"),
        Some(start) if start != owner.start_time => {
            Some("its launcher is gone (its pid is another process's now)")
        }
        Some(_) => None,
    }
}

/// The start time of a live process (`/proc/PID/stat` field 22); `None`
/// when there is no such process or it is a zombie (dead, not yet reaped).
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/PID/stat` line, `None` for a zombie. The command
/// name (field 2) may hold spaces and parentheses: fields are counted
/// after its last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // Field 3, the state.
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    // Fields 4 to 21, then 22.
    fields.nth(22 - 4)?.parse().ok()
}

/// The name of a tier directory: `relaunch-snap-UID-PID-RANDOM`.
pub fn dir_name(uid: u32, pid: i32, random: u32) -> String {
    format!("{PREFIX}{uid}-{pid}-{random:08x}")
}

/// What the names of `uid`'s tier directories start with.
fn user_prefix(uid: u32) -> String {
    format!("{PREFIX}{uid}-")
}

/// Removes the tier directories in `root` that launchers of this user left
/// when they died without cleaning up (SIGKILL, a crash, the machine's
/// power); returns them. Directories of other users, of live launchers,
/// of other machines and pid namespaces, and young ones without an owner
/// file are left alone.
pub fn sweep(root: &Path, here: &Here) -> Vec<PathBuf> {
    if process_start_time(nix::unistd::getpid().as_raw()).is_none() {
        // Without `/proc`, every owner would look gone.
        tracing::debug!("cannot read /proc; no snapshot directory swept");
        return Vec::new();
    }
    let uid = nix::unistd::geteuid().as_raw();
    let prefix = user_prefix(uid);
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(root = %root.display(), error = %e, "cannot list the snapshot root; nothing swept");
            return Vec::new();
        }
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        if !entry.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let path = entry.path();
        // Never through a link, never another user's.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        let owner = read_owner(&path);
        let age = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .unwrap_or_default();
        let Some(why) = stale(owner.as_ref(), age, here, process_start_time) else {
            continue;
        };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(dir = %path.display(), why, "removed a stale snapshot directory");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(dir = %path.display(), why, error = %e, "cannot remove a stale snapshot directory");
            }
        }
    }
    removed
}

fn read_owner(dir: &Path) -> Option<Owner> {
    let text = std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// This launcher's tier directory; removed when dropped, so every way out
/// of the launcher that runs code removes it.
#[derive(Debug)]
pub struct SnapshotDir {
    path: PathBuf,
    budget: u64,
}

impl SnapshotDir {
    /// Makes the directory in `config.root` (mode 0700) and writes its
    /// owner file atomically (a temporary file renamed into place), so
    /// that a reader sees no owner or the whole one.
    pub fn create(config: &SnapshotConfig, run_id: &str) -> io::Result<Self> {
        let uid = nix::unistd::geteuid().as_raw();
        let pid = nix::unistd::getpid().as_raw();
        let random = u32::from_be_bytes(
            uuid::Uuid::new_v4().as_bytes()[..4]
                .try_into()
                .unwrap_or_default(),
        );
        let path = config.root.join(dir_name(uid, pid, random));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        // From here on, dropping `dir` removes what was made.
        let dir = Self {
            path,
            budget: config.budget,
        };
        // The umask may have taken bits off the mode.
        std::fs::set_permissions(
            &dir.path,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        let here = Here::probe();
        let owner = Owner {
            pid,
            start_time: process_start_time(pid).unwrap_or_default(),
            run_id: run_id.to_owned(),
            hostname: here.hostname,
            boot_id: here.boot_id,
            pid_namespace: here.pid_namespace,
        };
        let text = serde_json::to_vec(&owner).map_err(io::Error::other)?;
        let partial = dir.path.join(format!("{OWNER_FILE}.partial"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)?;
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&partial, dir.path.join(OWNER_FILE))?;
        tracing::debug!(dir = %dir.path.display(), budget = dir.budget, "made the snapshot directory");
        Ok(dir)
    }

    /// `RELAUNCH_SNAPSHOT_DIR`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `RELAUNCH_SNAPSHOT_MEMORY`, in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }
}

impl Drop for SnapshotDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => tracing::debug!(dir = %self.path.display(), "removed the snapshot directory"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                dir = %self.path.display(),
                error = %e,
                "cannot remove the snapshot directory; the next launcher on this node removes it"
            ),
        }
    }
}

/// The launch's tier directory, made before the first attempt: `None`
/// without a tier; when it cannot be made, an error if it was asked for
/// explicitly, else no tier and the warning to show.
pub fn open(
    config: Option<&SnapshotConfig>,
    run_id: &str,
) -> Result<(Option<SnapshotDir>, Option<String>), crate::LaunchError> {
    let Some(config) = config else {
        return Ok((None, None));
    };
    match SnapshotDir::create(config, run_id) {
        Ok(dir) => Ok((Some(dir), None)),
        Err(e) if config.required => Err(crate::LaunchError::Config(format!(
            "--snapshot-memory: cannot make the memory tier's directory in {}: {e}; set \
             {SNAPSHOT_ROOT_ENV} to a writable directory in memory, or give --snapshot-memory 0 \
             to run without the memory tier",
            config.root.display()
        ))),
        Err(e) => Ok((
            None,
            Some(format!(
                "relaunch: warning: no memory tier for checkpoints: cannot make a directory in \
                 {}: {e}",
                config.root.display()
            )),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            pid: 4242,
            start_time: 777,
            run_id: "job".into(),
            hostname: "node1".into(),
            boot_id: "boot-a".into(),
            pid_namespace: "pid:[1]".into(),
        }
    }

    fn here() -> Here {
        Here {
            hostname: "node1".into(),
            boot_id: "boot-a".into(),
            pid_namespace: "pid:[1]".into(),
        }
    }

    #[test]
    fn a_directory_is_stale_only_when_its_launcher_is_surely_gone() {
        let young = Duration::from_secs(5);
        let owner = owner();
        let live = |pid| (pid == 4242).then_some(777);
        assert_eq!(stale(Some(&owner), young, &here(), live), None);
        // The pid is gone.
        assert!(stale(Some(&owner), young, &here(), |_| None).is_some());
        // The pid is alive, but another process's: reused.
        let reused = stale(Some(&owner), young, &here(), |_| Some(778));
        assert!(reused.is_some_and(|why| why.contains("another process")));
        // An earlier boot's launcher is gone whatever its pid.
        let rebooted = Here {
            boot_id: "boot-b".into(),
            ..here()
        };
        assert!(stale(Some(&owner), young, &rebooted, live).is_some());
        // Not ours to judge: another host's, or another pid namespace's.
        let elsewhere = Here {
            hostname: "node2".into(),
            ..here()
        };
        assert_eq!(stale(Some(&owner), young, &elsewhere, |_| None), None);
        let container = Here {
            pid_namespace: "pid:[2]".into(),
            ..here()
        };
        assert_eq!(stale(Some(&owner), young, &container, |_| None), None);
    }

    #[test]
    fn a_directory_without_an_owner_is_kept_for_an_hour() {
        let never = |_| None;
        assert_eq!(
            stale(None, Duration::from_secs(59 * 60), &here(), never),
            None
        );
        assert!(stale(None, Duration::from_secs(61 * 60), &here(), never).is_some());
    }

    #[test]
    fn start_times_are_read_after_the_command_name() {
        let mut fields = vec!["S".to_owned()];
        fields.extend((4..=52).map(|n| n.to_string()));
        let line = format!("123 (a) b (c)) {}", fields.join(" "));
        assert_eq!(parse_start_time(&line), Some(22));
        let zombie = line.replacen(") S ", ") Z ", 1);
        assert_eq!(parse_start_time(&zombie), None);
        assert_eq!(parse_start_time("garbage"), None);
        let me = nix::unistd::getpid().as_raw();
        assert!(process_start_time(me).is_some());
    }

    #[test]
    fn names_say_whose_directory_it_is() {
        assert_eq!(dir_name(1000, 42, 0xab), "relaunch-snap-1000-42-000000ab");
        assert!(dir_name(1000, 42, u32::MAX).starts_with(&user_prefix(1000)));
        assert!(!dir_name(10001, 42, 1).starts_with(&user_prefix(1000)));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "relaunch-snapshot-test-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_directory_is_private_owned_and_removed_on_drop() {
        let root = scratch("drop");
        let config = SnapshotConfig {
            root: root.clone(),
            budget: 1 << 20,
            required: true,
        };
        let dir = SnapshotDir::create(&config, "job").unwrap();
        let path = dir.path().to_path_buf();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        let owner = read_owner(&path).unwrap();
        assert_eq!(owner.pid, nix::unistd::getpid().as_raw());
        assert_eq!(owner.run_id, "job");
        assert_eq!(
            Some(owner.start_time),
            process_start_time(nix::unistd::getpid().as_raw())
        );
        // A live launcher's directory survives a sweep.
        assert!(sweep(&root, &Here::probe()).is_empty());
        std::fs::write(path.join("snap"), b"x").unwrap();
        drop(dir);
        assert!(!path.exists());
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_sweep_removes_dead_launchers_directories_only() {
        let root = scratch("sweep");
        let here = Here::probe();
        let uid = nix::unistd::geteuid().as_raw();
        let dead = root.join(dir_name(uid, 1, 1));
        std::fs::create_dir(&dead).unwrap();
        let gone = Owner {
            pid: i32::MAX,
            start_time: 1,
            run_id: "old".into(),
            hostname: here.hostname.clone(),
            boot_id: here.boot_id.clone(),
            pid_namespace: here.pid_namespace.clone(),
        };
        std::fs::write(dead.join(OWNER_FILE), serde_json::to_vec(&gone).unwrap()).unwrap();
        let ownerless = root.join(dir_name(uid, 2, 2));
        std::fs::create_dir(&ownerless).unwrap();
        let other_user = root.join(dir_name(uid.wrapping_add(1), 3, 3));
        std::fs::create_dir(&other_user).unwrap();
        std::fs::write(
            other_user.join(OWNER_FILE),
            serde_json::to_vec(&gone).unwrap(),
        )
        .unwrap();
        assert_eq!(sweep(&root, &here), std::slice::from_ref(&dead));
        assert!(!dead.exists() && ownerless.exists() && other_user.exists());
        std::fs::remove_dir_all(root).unwrap();
    }
}
