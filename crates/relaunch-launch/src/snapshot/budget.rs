//! How much the memory tier of checkpoints may hold (`--snapshot-memory`),
//! decided once at start against the snapshot root's free space and the
//! node's memory: an explicit size the root cannot hold stops the launch;
//! the default takes a quarter of the memory, at most what the root has.

use std::io;
use std::path::{Path, PathBuf};

/// The directory the tier's directories are made in, instead of `/dev/shm`.
pub const SNAPSHOT_ROOT_ENV: &str = "RELAUNCH_SNAPSHOT_ROOT";
/// The root without `RELAUNCH_SNAPSHOT_ROOT`: memory, on every Linux.
pub const DEFAULT_ROOT: &str = "/dev/shm";
/// The default budget is this fraction of the node's memory.
const DEFAULT_SHARE: u64 = 4;

/// The root the tier's directory goes in: `$RELAUNCH_SNAPSHOT_ROOT`, else
/// `/dev/shm`, made absolute (workers may change directory). `env` looks
/// up the launcher's environment.
pub fn root(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let root = env(SNAPSHOT_ROOT_ENV)
        .filter(|r| !r.trim().is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_ROOT), PathBuf::from);
    std::path::absolute(&root).unwrap_or(root)
}

/// What the root offers a new tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootSpace {
    /// A writable directory with this many bytes free for an unprivileged
    /// user (`f_bavail * f_frsize`).
    Free(u64),
    /// Not usable, and why ("does not exist", "is not writable", ...).
    Unusable(String),
}

impl RootSpace {
    /// Looks at the root.
    pub fn probe(root: &Path) -> Self {
        match std::fs::metadata(root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Self::Unusable("does not exist".into());
            }
            Err(e) => return Self::Unusable(format!("cannot be read ({e})")),
            Ok(meta) if !meta.is_dir() => {
                return Self::Unusable("is not a directory".into());
            }
            Ok(_) => {}
        }
        use nix::unistd::AccessFlags;
        if let Err(e) = nix::unistd::access(root, AccessFlags::W_OK | AccessFlags::X_OK) {
            return Self::Unusable(format!("is not writable ({})", e.desc()));
        }
        match nix::sys::statvfs::statvfs(root) {
            Ok(stat) => Self::Free(stat.blocks_available().saturating_mul(stat.fragment_size())),
            Err(e) => Self::Unusable(format!("cannot be measured ({})", e.desc())),
        }
    }
}

/// The tier a launch gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A tier of this many bytes.
    Budget(u64),
    /// No tier: `--snapshot-memory 0`.
    Off,
    /// No tier, since the default could not have one; the warning says why.
    Unavailable(String),
}

/// Decides the tier from `--snapshot-memory` (`requested`, `None` when not
/// given), the node's memory and what the root has free. A size given
/// explicitly that the root cannot hold is an error (the launch must not
/// start); the default makes do with what there is, or warns and goes
/// without.
pub fn decide(
    requested: Option<u64>,
    memory: Option<u64>,
    root: &Path,
    space: &RootSpace,
) -> Result<Decision, String> {
    let root_text = root.display();
    match (requested, space) {
        (Some(0), _) => Ok(Decision::Off),
        (Some(bytes), RootSpace::Unusable(why)) => Err(format!(
            "--snapshot-memory {}: the snapshot root {root_text} {why}; set \
             {SNAPSHOT_ROOT_ENV} to a writable directory in memory, or give \
             --snapshot-memory 0 to run without the memory tier",
            human(bytes)
        )),
        (Some(bytes), RootSpace::Free(free)) if bytes > *free => Err(format!(
            "--snapshot-memory {} is more than the {} free in {root_text}: lower \
             --snapshot-memory or {}",
            human(bytes),
            human(*free),
            enlarge_hint(root)
        )),
        (Some(bytes), RootSpace::Free(_)) => Ok(Decision::Budget(bytes)),
        (None, RootSpace::Unusable(why)) => Ok(Decision::Unavailable(format!(
            "no memory tier for checkpoints: the snapshot root {root_text} {why}; set \
             {SNAPSHOT_ROOT_ENV} to a writable directory in memory (or give --snapshot-memory 0 \
             to run without one)"
        ))),
        (None, RootSpace::Free(free)) => match default_budget(memory, *free) {
            0 => Ok(Decision::Unavailable(format!(
                "no memory tier for checkpoints: {root_text} has no space free; {} (or give \
                 --snapshot-memory 0 to run without one)",
                enlarge_hint(root)
            ))),
            bytes => Ok(Decision::Budget(bytes)),
        },
    }
}

/// The budget without `--snapshot-memory`: a quarter of the node's memory
/// (all that the root has free when the memory is unknown), at most what
/// the root has free.
pub fn default_budget(memory: Option<u64>, free: u64) -> u64 {
    memory.map_or(free, |m| m / DEFAULT_SHARE).min(free)
}

/// How to give the root more space, said for the usual setups.
fn enlarge_hint(root: &Path) -> String {
    if root == Path::new(DEFAULT_ROOT) {
        format!(
            "enlarge {DEFAULT_ROOT} (Docker: --shm-size, Kubernetes: an emptyDir with medium: \
             Memory mounted there)"
        )
    } else {
        format!(
            "free space in {} (or point {SNAPSHOT_ROOT_ENV} at a larger memory filesystem)",
            root.display()
        )
    }
}

/// A size for people, with its exact bytes: `1.5 GiB (1610612736 bytes)`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| bytes >= *size) {
        Some((size, unit)) => format!("{:.1} {unit} ({bytes} bytes)", bytes as f64 / *size as f64),
        None => format!("{bytes} bytes"),
    }
}

/// The node's memory as the default budget sees it: `MemTotal`, or the
/// cgroup's memory limit where that is lower (a container's snapshots in
/// `/dev/shm` count against its limit).
pub fn node_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total(&text));
    match (total, cgroup_memory_limit()) {
        (Some(total), Some(limit)) => Some(total.min(limit)),
        (total, limit) => total.or(limit),
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// The lowest memory limit of this process's cgroup and its ancestors
/// (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`); `None` without one.
fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut lowest: Option<u64> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mount, file) = match controllers {
            "" => (PathBuf::from("/sys/fs/cgroup"), "memory.max"),
            c if c.split(',').any(|c| c == "memory") => (
                PathBuf::from("/sys/fs/cgroup/memory"),
                "memory.limit_in_bytes",
            ),
            _ => continue,
        };
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            if let Some(limit) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
            {
                lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
            }
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_is_a_quarter_of_memory_at_most_what_the_root_has_free() {
        assert_eq!(default_budget(Some(64 * GIB), 32 * GIB), 16 * GIB);
        assert_eq!(default_budget(Some(64 * GIB), 64 << 20), 64 << 20);
        assert_eq!(default_budget(None, 8 * GIB), 8 * GIB);
        assert_eq!(default_budget(Some(64 * GIB), 0), 0);
    }

    #[test]
    fn an_explicit_size_the_root_cannot_hold_refuses_to_start() {
        let shm = Path::new(DEFAULT_ROOT);
        let err = decide(Some(2 * GIB), Some(64 * GIB), shm, &RootSpace::Free(GIB)).unwrap_err();
        for needle in [
            "--snapshot-memory 2.0 GiB (2147483648 bytes)",
            "the 1.0 GiB (1073741824 bytes) free in /dev/shm",
            "lower --snapshot-memory or enlarge /dev/shm",
            "--shm-size",
            "medium: Memory",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        let other = Path::new("/mnt/ram");
        let err = decide(Some(2 * GIB), None, other, &RootSpace::Free(GIB)).unwrap_err();
        assert!(err.contains("free space in /mnt/ram"), "{err}");
        assert!(err.contains(SNAPSHOT_ROOT_ENV), "{err}");
        let missing = RootSpace::Unusable("does not exist".into());
        let err = decide(Some(GIB), None, other, &missing).unwrap_err();
        assert!(
            err.contains("the snapshot root /mnt/ram does not exist"),
            "{err}"
        );
        // Exactly what is free fits.
        assert_eq!(
            decide(Some(GIB), None, shm, &RootSpace::Free(GIB)),
            Ok(Decision::Budget(GIB))
        );
    }

    #[test]
    fn zero_is_off_whatever_the_root() {
        for space in [RootSpace::Free(0), RootSpace::Unusable("gone".into())] {
            assert_eq!(
                decide(Some(0), None, Path::new("/x"), &space),
                Ok(Decision::Off)
            );
        }
    }

    #[test]
    fn the_default_goes_without_a_tier_when_the_root_cannot_have_one() {
        let shm = Path::new(DEFAULT_ROOT);
        let unwritable = RootSpace::Unusable("is not writable (Permission denied)".into());
        let Ok(Decision::Unavailable(why)) = decide(None, Some(GIB), shm, &unwritable) else {
            panic!("not unavailable");
        };
        assert!(why.contains("/dev/shm is not writable"), "{why}");
        let Ok(Decision::Unavailable(why)) = decide(None, Some(GIB), shm, &RootSpace::Free(0))
        else {
            panic!("not unavailable");
        };
        assert!(why.contains("no space free"), "{why}");
        assert_eq!(
            decide(None, Some(4 * GIB), shm, &RootSpace::Free(8 * GIB)),
            Ok(Decision::Budget(GIB))
        );
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       65843212 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total(meminfo), Some(65_843_212 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert!(node_memory().is_some_and(|m| m > 0));
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(64 << 20), "64.0 MiB (67108864 bytes)");
        assert_eq!(human(3 << 29), "1.5 GiB (1610612736 bytes)");
    }

    #[test]
    fn a_root_that_cannot_hold_a_tier_says_why() {
        let root = std::env::temp_dir().join(format!(
            "relaunch-budget-test-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&root).unwrap();
        assert!(matches!(RootSpace::probe(&root), RootSpace::Free(n) if n > 0));
        assert_eq!(
            RootSpace::probe(&root.join("missing")),
            RootSpace::Unusable("does not exist".into())
        );
        let file = root.join("file");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(
            RootSpace::probe(&file),
            RootSpace::Unusable("is not a directory".into())
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
