//! The client's directory on disk: one folder per run, one spool per writer
//! (a process that logs), each with a `writer.json` that says which run and
//! attempt its records belong to, so that another process (the next
//! `init` of the run, or `relaunch sync`) can ship what a dead one left.
//!
//! ```text
//! DIR/RUN_ID/WRITER/writer.json   the run to open and the attempt token
//! DIR/RUN_ID/WRITER/seg-*.spool   the spool (see `spool`)
//! DIR/RUN_ID/.WRITER.creating/    a writer being created (renamed to WRITER)
//! ```
//!
//! A writer's directory gets its name only once its spool's lock is held
//! (`create_writer`), so a process looking for spools that dead processes
//! left (`Run::start`, `relaunch sync`) can never lock, ship or remove a
//! live writer's spool: whatever it can lock under a writer's name has no
//! live writer.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use relaunch_api::RunInit;
use serde::{Deserialize, Serialize};

use crate::error::ClientError;
use crate::http::check_run_id;
use crate::spool::{Spool, SpoolLock};

/// The environment variable naming the client's directory.
pub const DIR_ENV: &str = "RELAUNCH_DIR";

/// The client's directory when neither an argument nor `RELAUNCH_DIR` names
/// one: `$XDG_STATE_HOME/relaunch/runs`, else `~/.local/state/relaunch/runs`
/// (out of the user's working tree; state rather than cache, since a spool
/// holds records the server does not have yet, which a cache cleaner must
/// not delete); `./relaunch-runs` only where neither is set.
pub fn default_dir() -> PathBuf {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))
        .map(|state| state.join("relaunch").join("runs"))
        .unwrap_or_else(|| PathBuf::from("relaunch-runs"))
}
const WRITER_FILE: &str = "writer.json";
/// Ends the temporary name of a writer's directory while it is created.
const CREATING_SUFFIX: &str = ".creating";
const FORMAT: u32 = 1;

/// What a writer's spool belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriterInfo {
    pub format: u32,
    pub writer: String,
    /// What to send to `POST /runs` before the records; its `id` is set.
    pub run: RunInit,
    /// Where the records were meant to go; `None` when logged offline.
    pub server: Option<String>,
    /// Seconds since the Unix epoch.
    pub created: f64,
    pub pid: u32,
}

impl WriterInfo {
    pub fn run_id(&self) -> &str {
        self.run.id.as_deref().unwrap_or_default()
    }
}

/// `DIR/RUN_ID`, with the id checked so that it stays inside `DIR`.
pub fn run_dir(dir: &Path, run_id: &str) -> Result<PathBuf, ClientError> {
    check_run_id(run_id)?;
    Ok(dir.join(run_id))
}

/// Creates `DIR/RUN_ID/WRITER/` with its `writer.json` and returns it with
/// its spool's lock, held from before the directory had that name: it is
/// built as `.WRITER.creating`, locked, given `writer.json`, then renamed.
pub fn create_writer(dir: &Path, info: &WriterInfo) -> Result<(PathBuf, SpoolLock), ClientError> {
    check_writer_id(&info.writer)?;
    let run_dir = run_dir(dir, info.run_id())?;
    let writer_dir = run_dir.join(&info.writer);
    let creating = run_dir.join(format!(".{}{CREATING_SUFFIX}", info.writer));
    fs::create_dir_all(&creating)
        .map_err(ClientError::io("create the spool directory", &creating))?;
    let lock = Spool::lock(&creating)?;
    let path = creating.join(WRITER_FILE);
    let temp = creating.join("writer.json.tmp");
    let json = serde_json::to_vec_pretty(info)
        .map_err(|e| ClientError::Config(format!("the run's settings are not JSON: {e}")))?;
    let mut file = fs::File::create(&temp).map_err(ClientError::io("create", &temp))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(ClientError::io("write", &temp))?;
    fs::rename(&temp, &path).map_err(ClientError::io("rename into place", &path))?;
    fs::rename(&creating, &writer_dir)
        .map_err(ClientError::io("rename into place", &writer_dir))?;
    fs::File::open(&run_dir)
        .and_then(|d| d.sync_all())
        .map_err(ClientError::io("sync", &run_dir))?;
    Ok((writer_dir, lock))
}

/// Whether `path` holds a writer's `writer.json` (complete: it is renamed
/// into place whole).
pub fn is_writer_dir(path: &Path) -> bool {
    path.join(WRITER_FILE).is_file()
}

pub fn read_writer(writer_dir: &Path) -> Result<WriterInfo, ClientError> {
    let path = writer_dir.join(WRITER_FILE);
    let bytes = fs::read(&path).map_err(ClientError::io("read", &path))?;
    let info: WriterInfo = serde_json::from_slice(&bytes).map_err(|e| {
        ClientError::Corrupt(format!(
            "{} is not a relaunch writer file ({e}); move the directory away if it is not a spool",
            path.display()
        ))
    })?;
    if info.format != FORMAT {
        return Err(ClientError::Corrupt(format!(
            "{} has format {}, this relaunch reads format {FORMAT}; sync it with the relaunch that wrote it",
            path.display(),
            info.format
        )));
    }
    check_writer_id(&info.writer)?;
    check_run_id(info.run_id())?;
    Ok(info)
}

/// Writer ids name directories: the same rules as run ids.
pub fn check_writer_id(id: &str) -> Result<(), ClientError> {
    relaunch_api::names::check_name("writer id", id).map_err(ClientError::Config)
}

/// A place found under a directory being synced.
#[derive(Debug)]
pub enum Found {
    Writer(PathBuf),
    /// A symbolic link, never followed: a spool directory lives inside the
    /// tree being synced.
    Symlink(PathBuf),
}

/// Every writer directory at or below `root` (which may be the client's
/// directory, a run's, or one writer's), in a stable order. Symlinks are
/// reported, not followed.
pub fn find_writers(root: &Path) -> Result<Vec<Found>, ClientError> {
    let meta = fs::symlink_metadata(root).map_err(ClientError::io("read", root))?;
    if meta.file_type().is_symlink() {
        return Ok(vec![Found::Symlink(root.to_path_buf())]);
    }
    if !meta.is_dir() {
        return Err(ClientError::Config(format!(
            "{} is not a directory; give the client's directory (default {}) or one run's",
            root.display(),
            default_dir().display()
        )));
    }
    let mut found = Vec::new();
    walk(root, 0, &mut found)?;
    Ok(found)
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<Found>) -> Result<(), ClientError> {
    if dir.join(WRITER_FILE).is_file() {
        found.push(match link_inside(dir)? {
            Some(link) => Found::Symlink(link),
            None => Found::Writer(dir.to_path_buf()),
        });
        return Ok(());
    }
    // DIR/RUN/WRITER: nothing deeper is ours.
    if depth >= 2 {
        return Ok(());
    }
    let mut entries = fs::read_dir(dir)
        .map_err(ClientError::io("list", dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(ClientError::io("list", dir))?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().map_err(ClientError::io("read", &path))?;
        if kind.is_symlink() {
            found.push(Found::Symlink(path));
        } else if kind.is_dir() {
            walk(&path, depth + 1, found)?;
        }
    }
    Ok(())
}

/// The first symbolic link among a writer directory's files, if any. A
/// spool never holds one, and opening and acknowledging it would read and
/// write wherever such a link points.
pub fn link_inside(writer_dir: &Path) -> Result<Option<PathBuf>, ClientError> {
    let mut entries = fs::read_dir(writer_dir)
        .map_err(ClientError::io("list", writer_dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(ClientError::io("list", writer_dir))?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry
            .file_type()
            .map_err(ClientError::io("read", &path))?
            .is_symlink()
        {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Removes a writer's directory once everything in it is on the server,
/// and its run's directory when that was the last writer. Takes the open
/// spool as proof that its lock is held until the directory is gone: a
/// process that locked it between an unlock and the removal (an adopter, a
/// resumed writer) would append to a directory deleted under it.
pub fn remove_writer(spool: &Spool) -> Result<(), ClientError> {
    let writer_dir = spool.dir();
    if !spool.is_locked() {
        return Err(ClientError::Config(format!(
            "refusing to remove {}: its spool was closed, so another process may hold it",
            writer_dir.display()
        )));
    }
    // Renamed out of sight first: an adopter that listed it a moment ago
    // may open its lock file (creating it) while it is removed, and
    // `remove_dir_all` would then find it not empty. Under the new name
    // nobody else looks for it.
    let name = writer_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let doomed = writer_dir.with_file_name(format!(".{name}.removing-{}", std::process::id()));
    match fs::rename(writer_dir, &doomed) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ClientError::io("rename", writer_dir)(e)),
    }
    fs::remove_dir_all(&doomed).map_err(ClientError::io("remove", &doomed))?;
    if let Some(run_dir) = writer_dir.parent() {
        // Fails, as it should, while other writers remain.
        let _ = fs::remove_dir(run_dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run: &str, writer: &str) -> WriterInfo {
        WriterInfo {
            format: FORMAT,
            writer: writer.into(),
            run: RunInit {
                id: Some(run.into()),
                attempt_token: "t".into(),
                ..RunInit::default()
            },
            server: None,
            created: 0.0,
            pid: 1,
        }
    }

    #[test]
    fn writers_are_found_and_symlinks_reported_not_followed() {
        let root = std::env::temp_dir().join(format!("relaunch-local-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let a = create_writer(&root, &info("run1", "w1")).unwrap().0;
        let b = create_writer(&root, &info("run2", "w2")).unwrap().0;
        let outside = std::env::temp_dir().join(format!("relaunch-outside-{}", std::process::id()));
        create_writer(&outside, &info("run3", "w3")).unwrap();
        std::os::unix::fs::symlink(outside.join("run3"), root.join("run3")).unwrap();
        let found = find_writers(&root).unwrap();
        let writers: Vec<_> = found
            .iter()
            .filter_map(|f| match f {
                Found::Writer(p) => Some(p.clone()),
                Found::Symlink(_) => None,
            })
            .collect();
        assert_eq!(writers, [a.clone(), b]);
        assert!(matches!(&found[2], Found::Symlink(p) if p.ends_with("run3")));
        assert_eq!(read_writer(&a).unwrap(), info("run1", "w1"));
        // One run's directory, or one writer's, works too.
        assert_eq!(find_writers(&root.join("run1")).unwrap().len(), 1);
        assert_eq!(find_writers(&a).unwrap().len(), 1);
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_spool_holding_a_symlink_is_reported_not_opened() {
        let root = std::env::temp_dir().join(format!("relaunch-local-link-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let w = create_writer(&root, &info("r", "w")).unwrap().0;
        let victim = root.join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, w.join("acked.tmp")).unwrap();
        let found = find_writers(&root).unwrap();
        assert!(
            matches!(&found[..], [Found::Symlink(p)] if p.ends_with("acked.tmp")),
            "{found:?}"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_corrupt_writer_file_says_what_to_do() {
        let root = std::env::temp_dir().join(format!("relaunch-local-bad-{}", std::process::id()));
        let w = create_writer(&root, &info("r", "w")).unwrap().0;
        fs::write(w.join(WRITER_FILE), b"{not json").unwrap();
        let err = read_writer(&w).unwrap_err().to_string();
        assert!(err.contains("not a relaunch writer file"), "{err}");
        assert!(create_writer(&root, &info("../escape", "w")).is_err());
        assert!(create_writer(&root, &info("r", "../w")).is_err());
        fs::remove_dir_all(&root).unwrap();
    }
}
