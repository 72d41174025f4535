//! Checkpoints a job shipped to the tracking server, brought back: what
//! `relaunch ckpt pull` does, so that a job resumes on a machine that never
//! saw its files.
//!
//! `relaunch.Checkpointer` ships a committed checkpoint `DIR/step_N` as the
//! run's files `checkpoints/step_N/NAME`, its `manifest.json` last: a
//! manifest on the server means every file it lists is there. A pull
//! downloads the manifest and the files it lists into a temporary directory
//! beside the destination, checks each file's size and BLAKE3 against the
//! manifest, and renames the directory to `step_N`: the checkpointer's own
//! commit, so a pull cut short leaves nothing that looks committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use relaunch_api::FileInfo;
use relaunch_api::files::check_file_name;
use serde::Deserialize;

use crate::error::ClientError;
use crate::files::{Progress, download};
use crate::http::Client;

/// Where the server keeps a run's checkpoints.
pub const PREFIX: &str = "checkpoints/";
/// The commit marker of a checkpoint, shipped last.
pub const MANIFEST: &str = "manifest.json";

/// What a pull brought back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    pub step: u64,
    pub dir: PathBuf,
    pub files: usize,
    pub bytes: u64,
}

#[derive(Deserialize)]
struct Manifest {
    step: u64,
    files: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    size: u64,
    blake3: String,
}

/// `step_00000042`, the directory name the checkpointer gives step 42.
pub fn step_dir(step: u64) -> String {
    format!("step_{step:08}")
}

/// The steps whose checkpoint is complete on the server, ascending.
pub fn shipped_steps(files: &[FileInfo]) -> Vec<u64> {
    let mut steps: Vec<u64> = files
        .iter()
        .filter_map(|f| {
            let rest = f.name.strip_prefix(PREFIX)?;
            let (dir, name) = rest.split_once('/')?;
            let step = dir.strip_prefix("step_")?.parse().ok()?;
            (name == MANIFEST).then_some(step)
        })
        .collect();
    steps.sort_unstable();
    steps.dedup();
    steps
}

/// Brings checkpoint `step` (default: the newest complete one) of `run` into
/// `dir/step_N`. A checkpoint already there is left as it is.
pub async fn pull(
    client: &Client,
    run: &str,
    step: Option<u64>,
    dir: &Path,
    progress: &Progress<'_>,
) -> Result<Pulled, ClientError> {
    let files = client.files(run).await?;
    let steps = shipped_steps(&files);
    let step = match step {
        Some(step) if steps.contains(&step) => step,
        Some(step) => {
            return Err(ClientError::Config(format!(
                "run {run} has no complete checkpoint of step {step} on {}; it has {}",
                client.url(),
                describe(&steps)
            )));
        }
        None => *steps.last().ok_or_else(|| {
            ClientError::Config(format!(
                "run {run} has no complete checkpoint on {}: none was shipped (a Checkpointer \
                 under `relaunch run --server` ships each one it commits)",
                client.url()
            ))
        })?,
    };
    let name = step_dir(step);
    let dest = dir.join(&name);
    std::fs::create_dir_all(dir).map_err(ClientError::io("create", dir))?;
    let tmp = dir.join(format!(
        "{name}.tmp-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let result = fetch(client, run, step, &name, &files, &tmp, progress).await;
    let pulled = match result {
        Ok((count, bytes)) => {
            if dest.exists() {
                // Already here (pulled before, or never lost): keep it.
                let _ = std::fs::remove_dir_all(&tmp);
            } else {
                std::fs::rename(&tmp, &dest).map_err(ClientError::io("rename", &tmp))?;
                sync_dir(dir)?;
            }
            Pulled {
                step,
                dir: dest,
                files: count,
                bytes,
            }
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    Ok(pulled)
}

async fn fetch(
    client: &Client,
    run: &str,
    step: u64,
    name: &str,
    files: &[FileInfo],
    tmp: &Path,
    progress: &Progress<'_>,
) -> Result<(usize, u64), ClientError> {
    let remote = |file: &str| format!("{PREFIX}{name}/{file}");
    let manifest_path = tmp.join(MANIFEST);
    download(client, run, &remote(MANIFEST), &manifest_path, &|_, _| {}).await?;
    let text = std::fs::read(&manifest_path).map_err(ClientError::io("read", &manifest_path))?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
        ClientError::Corrupt(format!(
            "the manifest of checkpoint step {step} on the server is not a checkpoint manifest: {e}"
        ))
    })?;
    if manifest.step != step {
        return Err(ClientError::Corrupt(format!(
            "the manifest shipped as step {step} is of step {}",
            manifest.step
        )));
    }
    let on_server: BTreeMap<&str, &FileInfo> = files.iter().map(|f| (f.name.as_str(), f)).collect();
    let total: u64 = manifest.files.values().map(|e| e.size).sum();
    let mut done = 0u64;
    for (file, entry) in &manifest.files {
        check_file_name(file).map_err(|e| {
            ClientError::Corrupt(format!("the manifest of step {step} names a bad file: {e}"))
        })?;
        let shipped = on_server.get(remote(file).as_str()).ok_or_else(|| {
            ClientError::Corrupt(format!(
                "checkpoint step {step} lists {file}, which the server does not have"
            ))
        })?;
        if shipped.size != entry.size || shipped.blake3 != entry.blake3 {
            return Err(ClientError::Corrupt(format!(
                "the server's {file} of step {step} is not the file the manifest lists \
                 (size {} vs {}); pull another step",
                shipped.size, entry.size
            )));
        }
        let base = done;
        let part = |d: u64, _: u64| progress(base + d, total);
        download(client, run, &remote(file), &tmp.join(file), &part).await?;
        done += entry.size;
    }
    sync_dir(tmp)?;
    Ok((manifest.files.len(), total))
}

fn sync_dir(dir: &Path) -> Result<(), ClientError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(ClientError::io("sync", dir))
}

fn describe(steps: &[u64]) -> String {
    match steps {
        [] => "none".to_owned(),
        [one] => format!("step {one}"),
        _ => format!(
            "steps {}",
            steps
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str) -> FileInfo {
        FileInfo {
            name: name.into(),
            size: 1,
            blake3: String::new(),
            chunks: 1,
            created_at: 0.0,
        }
    }

    #[test]
    fn only_steps_with_a_shipped_manifest_count() {
        let files = [
            file("checkpoints/step_00000010/model.pt"),
            file("checkpoints/step_00000010/manifest.json"),
            file("checkpoints/step_00000020/model.pt"), // its manifest not yet shipped
            file("checkpoints/step_00000005/manifest.json"),
            file("other/step_00000030/manifest.json"),
            file("checkpoints/step_x/manifest.json"),
        ];
        assert_eq!(shipped_steps(&files), [5, 10]);
        assert_eq!(step_dir(42), "step_00000042");
        assert_eq!(describe(&[5, 10]), "steps 5, 10");
    }
}
