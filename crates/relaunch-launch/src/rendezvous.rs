//! Elastic rendezvous (`--rdzv-backend c10d`, `--nnodes MIN:MAX`) over the
//! job's store, in rounds.
//!
//! A round admits nodes in the order they join. It closes as soon as MAX
//! nodes have joined, or once MIN have and no one else came for the
//! last-call window; a node that comes later waits, and the members open
//! the next round to admit it (workers restart; that is not counted as a
//! restart). A round also ends when a member's worker fails (counted) or a
//! member stops sending heartbeats (a lost node; counted).
//!
//! A node whose store stops answering (a call unanswered for
//! `keep_alive_timeout`, the time after which the others would call this
//! node lost) stops its workers and tries to join again; the rendezvous'
//! own calls, reconnections included, wait at most `read_timeout`
//! (torchrun's setting, 60 s), after which the launcher fails naming the
//! store. Every key is under `relaunch/RUN_ID/rdzv/`:
//!
//! ```text
//! round/R/open        exists once round R is open (round 0 always is); why
//! round/R/joined      ADD counter: a node's join order, from 1
//! round/R/node/I      the I-th node: "NPROC HOSTNAME"
//! round/R/expected    how many the opener of round R expects back (members
//!                     of R-1 still alive, plus the nodes that were waiting)
//! round/R/closed      how many joined in time (first COMPARE_SET wins)
//! round/R/waiting     ADD counter of nodes that came after R closed
//! round/R/alive/I     ADD counter, bumped by member I every monitor interval
//! round/R/ready, go   start barrier; member 1 deletes the workers' keys between
//! restarts            ADD counter of rounds opened by a failure
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use relaunch_store::{ClientOptions, ErrorKind, StoreClient, StoreError};
use tokio::time::Instant;

use crate::error::LaunchError;
use crate::keys;

/// Settings from `--rdzv-conf`, with torchrun's defaults where it has them.
#[derive(Clone, Debug)]
pub struct RendezvousSettings {
    /// How long a round may wait for MIN nodes.
    pub join_timeout: Duration,
    /// After MIN nodes joined, how long to wait for more before closing.
    pub last_call: Duration,
    /// A member silent for this long is lost; a store that does not
    /// answer a member's heartbeat for this long is lost to that member.
    pub keep_alive_timeout: Duration,
    /// The longest the rendezvous waits for the store to answer one call,
    /// or to take a connection again.
    pub read_timeout: Duration,
    /// How often members send heartbeats and look for waiting nodes.
    pub monitor_interval: Duration,
    /// How long members may take to stop their workers before rejoining;
    /// a new round waits this much longer than the last call for them.
    pub stop_grace: Duration,
}

impl RendezvousSettings {
    /// Reads `join_timeout`, `last_call_timeout`, `keep_alive_timeout`,
    /// `read_timeout` (all seconds) from `--rdzv-conf`; refuses keys it does
    /// not know.
    pub fn from_conf(
        conf: &BTreeMap<String, String>,
        monitor_interval: Duration,
        stop_grace: Duration,
    ) -> Result<Self, LaunchError> {
        let mut s = Self {
            join_timeout: Duration::from_secs(600),
            last_call: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            monitor_interval: monitor_interval.max(Duration::from_millis(50)),
            stop_grace,
        };
        for (key, value) in conf {
            let seconds = value
                .parse::<f64>()
                .ok()
                .and_then(|v| Duration::try_from_secs_f64(v).ok())
                .ok_or_else(|| {
                    LaunchError::Config(format!(
                        "--rdzv-conf {key}={value}: not a number of seconds"
                    ))
                })?;
            match key.as_str() {
                "join_timeout" => s.join_timeout = seconds,
                "last_call_timeout" => s.last_call = seconds,
                "keep_alive_timeout" | "timeout" => s.keep_alive_timeout = seconds,
                "read_timeout" => s.read_timeout = seconds,
                other => {
                    return Err(LaunchError::Config(format!(
                        "--rdzv-conf: unknown setting {other:?}; known: join_timeout, \
                         last_call_timeout, keep_alive_timeout, read_timeout"
                    )));
                }
            }
        }
        if s.keep_alive_timeout.is_zero() || s.read_timeout.is_zero() {
            return Err(LaunchError::Config(
                "--rdzv-conf keep_alive_timeout and read_timeout must be more than 0 seconds"
                    .into(),
            ));
        }
        Ok(s)
    }

    /// Client options for the rendezvous' own connection: no call, nor a
    /// reconnection, waits longer than `read_timeout`.
    pub fn client_options(&self, base: &ClientOptions) -> ClientOptions {
        ClientOptions {
            timeout: self.read_timeout,
            connect_timeout: self.read_timeout,
            ..base.clone()
        }
    }

    /// Client options for the watcher of a running round: a store silent for
    /// `keep_alive_timeout` is lost to this node.
    pub fn watcher_options(&self, base: &ClientOptions) -> ClientOptions {
        ClientOptions {
            timeout: self.keep_alive_timeout,
            connect_timeout: self.keep_alive_timeout,
            ..base.clone()
        }
    }
}

/// This node's place in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership {
    pub round: u64,
    /// Join order, from 1; the node rank is `index - 1`.
    pub index: usize,
    pub nodes: usize,
    pub first_rank: usize,
    pub world_size: usize,
    /// Rounds opened by a failure so far (`TORCHELASTIC_RESTART_COUNT`).
    pub restarts: u32,
}

/// Why the members are moving to a new round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewRound {
    /// A worker failed on some node; counted as a restart.
    Failure(String),
    /// A node stopped sending heartbeats; counted as a restart.
    Lost(String),
    /// A node is waiting to join; not counted.
    Admit,
    /// The store stopped answering this node: its workers stop, and it
    /// tries to join again (the launcher fails if the store stays silent).
    /// Never written to the store; not counted.
    StoreLost(String),
}

impl NewRound {
    fn encode(&self) -> String {
        match self {
            Self::Failure(what) => format!("failure {what}"),
            Self::Lost(what) => format!("lost {what}"),
            Self::Admit => "admit".into(),
            Self::StoreLost(what) => format!("store-lost {what}"),
        }
    }

    fn decode(text: &str) -> Self {
        match text.split_once(' ') {
            Some(("failure", what)) => Self::Failure(what.into()),
            Some(("lost", what)) => Self::Lost(what.into()),
            Some(("store-lost", what)) => Self::StoreLost(what.into()),
            _ => Self::Admit,
        }
    }

    pub(crate) fn counts_as_restart(&self) -> bool {
        !matches!(self, Self::Admit | Self::StoreLost(_))
    }

    /// For the console.
    pub fn describe(&self) -> String {
        match self {
            Self::Failure(what) => what.clone(),
            Self::Lost(what) | Self::StoreLost(what) => what.clone(),
            Self::Admit => "a node is waiting to join; restarting all workers to admit it".into(),
        }
    }
}

/// One node's side of the elastic rendezvous.
#[derive(Debug)]
pub struct DynamicRendezvous {
    client: StoreClient,
    prefix: String,
    nproc: usize,
    min: usize,
    max: usize,
    hostname: String,
    pub settings: RendezvousSettings,
    /// The round this node last took part in, or waits for.
    round: u64,
}

impl DynamicRendezvous {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: StoreClient,
        run_id: &str,
        nproc: usize,
        min: usize,
        max: usize,
        hostname: String,
        settings: RendezvousSettings,
    ) -> Self {
        Self {
            client,
            prefix: format!("relaunch/{run_id}/rdzv"),
            nproc,
            min,
            max,
            hostname,
            settings,
            round: 0,
        }
    }

    fn key(&self, round: u64, rest: &str) -> String {
        format!("{}/round/{round}/{rest}", self.prefix)
    }

    /// Member `index`'s heartbeat counter in `round`.
    fn alive_key(&self, round: u64, index: usize) -> String {
        self.key(round, &format!("alive/{index}"))
    }

    /// The newest open round at or after `from`.
    async fn latest_round(&self, from: u64) -> Result<u64, StoreError> {
        let mut round = from;
        while self.client.check(&[self.key(round + 1, "open")]).await? {
            round += 1;
        }
        Ok(round)
    }

    /// Joins the newest round, waiting for a later one if it is closed, until
    /// admitted. Fails when fewer than MIN nodes come within the join timeout.
    pub async fn join(&mut self) -> Result<Membership, LaunchError> {
        let started = Instant::now();
        loop {
            let round = self.latest_round(self.round).await?;
            self.round = round;
            let closed_key = self.key(round, "closed");
            if self.client.check(&[&closed_key]).await? {
                self.wait_for_next_round(round, started).await?;
                continue;
            }
            let index = usize::try_from(self.client.add(self.key(round, "joined"), 1).await?)
                .unwrap_or(usize::MAX);
            self.client
                .set(
                    self.key(round, &format!("node/{index}")),
                    format!("{} {}", self.nproc, self.hostname),
                )
                .await?;
            let nodes = self.close(round, started).await?;
            if index > nodes {
                tracing::debug!(round, index, nodes, "joined too late for this round");
                self.wait_for_next_round(round, started).await?;
                continue;
            }
            return self.membership(round, index, nodes).await;
        }
    }

    /// Waits until round `round` closes, closing it when this node sees the
    /// conditions first: MAX joined, or everyone the round's opener expects
    /// back; else MIN joined and the last call (longer for a round that
    /// expects members back, which first stop their workers) has passed.
    /// Returns its size.
    async fn close(&self, round: u64, started: Instant) -> Result<usize, LaunchError> {
        let closed_key = self.key(round, "closed");
        let joined_key = self.key(round, "joined");
        let expected_key = self.key(round, "expected");
        let mut min_reached: Option<Instant> = None;
        loop {
            if self.client.check(&[&closed_key]).await? {
                let value = self.client.get_now(&closed_key).await?;
                return parse_count(&value, &closed_key);
            }
            let joined = parse_count(&self.client.get_now(&joined_key).await?, &joined_key)?;
            let expected = if self.client.check(&[&expected_key]).await? {
                Some(parse_count(
                    &self.client.get_now(&expected_key).await?,
                    &expected_key,
                )?)
            } else {
                None
            };
            let now = Instant::now();
            let mut close =
                joined >= self.max || expected.is_some_and(|e| joined >= e.max(self.min));
            if joined >= self.min {
                let since = *min_reached.get_or_insert(now);
                let window = match expected {
                    Some(_) => self.settings.last_call + self.settings.stop_grace,
                    None => self.settings.last_call,
                };
                close |= now.duration_since(since) >= window;
            } else if now.duration_since(started) >= self.settings.join_timeout {
                return Err(LaunchError::Rendezvous(format!(
                    "only {joined} of at least {} nodes joined within the join timeout of {:?} \
                     (raise it with --rdzv-conf join_timeout=SECONDS)",
                    self.min, self.settings.join_timeout
                )));
            }
            if close {
                let size = joined.min(self.max).to_string();
                let value = self.client.compare_set(&closed_key, "", &size).await?;
                return parse_count(&value, &closed_key);
            }
            // Woken early when another node closes the round.
            match self
                .client
                .wait(&[&closed_key], Duration::from_millis(100))
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Timeout => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn wait_for_next_round(
        &mut self,
        round: u64,
        started: Instant,
    ) -> Result<(), LaunchError> {
        self.client.add(self.key(round, "waiting"), 1).await?;
        let next = self.key(round + 1, "open");
        let left = self.settings.join_timeout.saturating_sub(started.elapsed());
        self.client.wait(&[&next], left).await.map_err(|e| {
            LaunchError::Rendezvous(format!(
                "waited {:?} to join the job, but its nodes did not open a new round: {e}",
                self.settings.join_timeout
            ))
        })?;
        self.round = round + 1;
        Ok(())
    }

    async fn membership(
        &self,
        round: u64,
        index: usize,
        nodes: usize,
    ) -> Result<Membership, LaunchError> {
        let mut nprocs = Vec::with_capacity(nodes);
        for i in 1..=nodes {
            let key = self.key(round, &format!("node/{i}"));
            let entry = self.client.get(&key).await?;
            let text = String::from_utf8_lossy(&entry);
            let nproc = text
                .split_once(' ')
                .and_then(|(n, _)| n.parse::<usize>().ok())
                .ok_or_else(|| {
                    LaunchError::Rendezvous(format!("malformed node entry {key}: {text:?}"))
                })?;
            nprocs.push(nproc);
        }
        let restarts = self.restarts().await?;
        Ok(Membership {
            round,
            index,
            nodes,
            first_rank: nprocs[..index - 1].iter().sum(),
            world_size: nprocs.iter().sum(),
            restarts,
        })
    }

    async fn restarts(&self) -> Result<u32, LaunchError> {
        let key = format!("{}/restarts", self.prefix);
        if !self.client.check(&[&key]).await? {
            return Ok(0);
        }
        Ok(
            u32::try_from(parse_count(&self.client.get_now(&key).await?, &key)?)
                .unwrap_or(u32::MAX),
        )
    }

    /// Start barrier of a round: every member arrives; member 1 deletes the
    /// previous round's worker keys; all start together.
    pub async fn start(&self, m: &Membership) -> Result<(), LaunchError> {
        let timeout = self.settings.join_timeout;
        self.client
            .barrier(self.key(m.round, "ready"), m.nodes as i64, timeout)
            .await
            .map_err(|e| {
                LaunchError::Rendezvous(format!(
                    "not every member of round {} arrived: {e}",
                    m.round
                ))
            })?;
        let go = self.key(m.round, "go");
        if m.index == 1 {
            let gone = delete_worker_keys(&self.client).await?;
            tracing::debug!(
                round = m.round,
                gone,
                "deleted the previous round's worker keys"
            );
            self.client.set(&go, "").await?;
        }
        self.client.wait(&[&go], timeout).await.map_err(|e| {
            LaunchError::Rendezvous(format!("round {} did not start: {e}", m.round))
        })?;
        Ok(())
    }

    /// Opens the round after `m`'s, for `why`; returns the reason that
    /// actually opened it (another member may have been first).
    pub async fn open_next(&self, m: &Membership, why: &NewRound) -> Result<NewRound, LaunchError> {
        let key = self.key(m.round + 1, "open");
        let value = self.client.compare_set(&key, "", why.encode()).await?;
        let opened = NewRound::decode(&String::from_utf8_lossy(&value));
        if opened == *why {
            // This node opened it: say who is expected back.
            let waiting_key = self.key(m.round, "waiting");
            let waiting = if self.client.check(&[&waiting_key]).await? {
                parse_count(&self.client.get_now(&waiting_key).await?, &waiting_key)?
            } else {
                0
            };
            let members = match why {
                NewRound::Lost(_) => m.nodes - 1,
                _ => m.nodes,
            };
            let expected = (members + waiting).min(self.max);
            self.client
                .set(self.key(m.round + 1, "expected"), expected.to_string())
                .await?;
            if why.counts_as_restart() {
                self.client
                    .add(format!("{}/restarts", self.prefix), 1)
                    .await?;
            }
        }
        Ok(opened)
    }

    /// Sends this node's heartbeats for round `m`, every `monitor_interval`,
    /// on `client`, until the returned guard is dropped. Its own task, not
    /// part of [`Self::watch`]: a node that is stopping (a signal, its
    /// grace period, the exit barrier) no longer watches, but must go on
    /// beating, or the others take a node that stops cleanly but slowly
    /// for a lost one and restart without it.
    pub fn keep_alive(&self, client: StoreClient, m: &Membership) -> KeepAlive {
        let key = self.alive_key(m.round, m.index);
        let every = self.settings.monitor_interval;
        KeepAlive(tokio::spawn(async move {
            loop {
                // A store that fails is the watch's to report.
                if let Err(e) = client.add(&key, 1).await {
                    tracing::debug!(error = %e, "heartbeat not sent");
                }
                tokio::time::sleep(every).await;
            }
        }))
    }

    /// Watches the job while round `m` runs and completes with the reason
    /// for a new round when one is opened, by anyone, or when this node
    /// opens one (a node waits, a member is lost). Uses its own connection,
    /// so the caller's stays free. This node's heartbeats are
    /// [`Self::keep_alive`]'s.
    pub async fn watch(&self, watcher: StoreClient, m: Membership) -> NewRound {
        let next = self.key(m.round + 1, "open");
        let waiting = self.key(m.round, "waiting");
        let mut last: BTreeMap<usize, (i64, Instant)> = BTreeMap::new();
        loop {
            match watcher.wait(&[&next], self.settings.monitor_interval).await {
                Ok(()) => match watcher.get_now(&next).await {
                    Ok(value) => return NewRound::decode(&String::from_utf8_lossy(&value)),
                    Err(e) => return self.store_lost(&watcher, e),
                },
                Err(e) if e.kind() == ErrorKind::Timeout => {}
                Err(e) => return self.store_lost(&watcher, e),
            }
            let round = async {
                let mut why = None;
                let joined_late = watcher.check(&[&waiting]).await? && {
                    let n = watcher.get_now(&waiting).await?;
                    String::from_utf8_lossy(&n).parse::<i64>().unwrap_or(0) > 0
                };
                if joined_late && m.nodes < self.max {
                    why = Some(NewRound::Admit);
                }
                let now = Instant::now();
                for i in (1..=m.nodes).filter(|&i| i != m.index) {
                    let key = self.alive_key(m.round, i);
                    let beats = if watcher.check(&[&key]).await? {
                        String::from_utf8_lossy(&watcher.get_now(&key).await?)
                            .parse::<i64>()
                            .unwrap_or(0)
                    } else {
                        0
                    };
                    let entry = last.entry(i).or_insert((beats, now));
                    if entry.0 != beats {
                        *entry = (beats, now);
                    } else if now.duration_since(entry.1) > self.settings.keep_alive_timeout
                        && why.is_none()
                    {
                        why = Some(NewRound::Lost(format!(
                            "node {} sent no heartbeat for {:?}; restarting without it",
                            i - 1,
                            self.settings.keep_alive_timeout
                        )));
                    }
                }
                Ok::<_, StoreError>(why)
            };
            match round.await {
                Ok(Some(why)) => {
                    return match self.open_next(&m, &why).await {
                        Ok(opened) => opened,
                        Err(e) => self.store_lost(&watcher, e),
                    };
                }
                Ok(None) => {}
                Err(e) => return self.store_lost(&watcher, e),
            }
        }
    }

    fn store_lost(&self, watcher: &StoreClient, e: impl std::fmt::Display) -> NewRound {
        NewRound::StoreLost(format!(
            "the job's store at {} did not answer within keep_alive_timeout ({:?}): {e}; \
             stopping the workers, then trying to join again for up to read_timeout ({:?})",
            watcher.addr(),
            self.settings.keep_alive_timeout,
            self.settings.read_timeout,
        ))
    }
}

/// This node's heartbeats, sent until it is dropped.
#[derive(Debug)]
pub struct KeepAlive(tokio::task::JoinHandle<()>);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn parse_count(value: &[u8], key: &str) -> Result<usize, LaunchError> {
    String::from_utf8_lossy(value)
        .trim()
        .parse::<usize>()
        .map_err(|_| LaunchError::Rendezvous(format!("{key} holds {value:?}, not a count")))
}

/// Deletes every key but the launchers' own, through the protocol (the
/// member doing it need not host the store).
pub async fn delete_worker_keys(client: &StoreClient) -> Result<usize, StoreError> {
    let mut gone = 0;
    for key in client.list_keys().await? {
        if !keys::is_launcher_key(&key) && client.delete_key(&key).await? {
            gone += 1;
        }
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_from_rdzv_conf() {
        let conf = BTreeMap::from([("last_call_timeout".to_string(), "1.5".to_string())]);
        let s =
            RendezvousSettings::from_conf(&conf, Duration::from_secs(1), Duration::ZERO).unwrap();
        assert_eq!(s.last_call, Duration::from_millis(1500));
        assert_eq!(s.join_timeout, Duration::from_secs(600));
        assert_eq!(s.read_timeout, Duration::from_secs(60));
        let zero = BTreeMap::from([("read_timeout".to_string(), "0".to_string())]);
        assert!(RendezvousSettings::from_conf(&zero, Duration::ZERO, Duration::ZERO).is_err());
        let bad = BTreeMap::from([("nope".to_string(), "1".to_string())]);
        assert!(RendezvousSettings::from_conf(&bad, Duration::ZERO, Duration::ZERO).is_err());
        let nan = BTreeMap::from([("join_timeout".to_string(), "soon".to_string())]);
        assert!(RendezvousSettings::from_conf(&nan, Duration::ZERO, Duration::ZERO).is_err());
    }

    #[test]
    fn reasons_roundtrip() {
        for why in [
            NewRound::Failure("node 1 failed".into()),
            NewRound::Lost("x".into()),
            NewRound::Admit,
            NewRound::StoreLost("y".into()),
        ] {
            assert_eq!(NewRound::decode(&why.encode()), why);
        }
        assert!(!NewRound::Admit.counts_as_restart());
        assert!(!NewRound::StoreLost("y".into()).counts_as_restart());
    }
}
