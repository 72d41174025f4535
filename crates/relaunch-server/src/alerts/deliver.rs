//! Posting the outbox: one task per webhook, each taking that webhook's
//! deliveries oldest first. A failed post (refused, timed out, not 2xx)
//! is retried after a backoff that doubles from 1 s to 5 min; while it
//! lasts, that webhook's later deliveries wait too, so they arrive in
//! order, and other webhooks are not held up. A delivery still not taken
//! a day after its alert was raised is given up. Each delivery, and each
//! giving up, is recorded as an event of the run.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::outbox::Pending;
use super::{Alerts, Webhook};
use crate::storage::Storage;

/// First wait after a failed post.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between two posts of one delivery.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A post that takes longer failed (a receiver that hangs).
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a failed post's answer is read (its first 200 characters
/// are said): a receiver's answer of any size costs no more memory.
const MAX_ANSWER_READ: usize = 4096;
/// A delivery not taken this long after its alert is given up.
const GIVE_UP_AFTER: f64 = 24.0 * 3600.0;
/// How often the outbox is looked at without a wake-up (deliveries written
/// by an earlier process of this server are found at start).
const IDLE_CHECK: Duration = Duration::from_secs(60);

/// Starts the delivery tasks; they end when the returned handles are
/// aborted (the server stopping): a post cut short is made again at the
/// next start.
pub(crate) fn spawn(alerts: &Arc<Alerts>, storage: &Arc<dyn Storage>) -> Vec<JoinHandle<()>> {
    let client = match reqwest::Client::builder()
        .timeout(POST_TIMEOUT)
        .connect_timeout(POST_TIMEOUT)
        .user_agent(concat!("relaunch/", env!("CARGO_PKG_VERSION")))
        // A webhook URL is posted to as given: a redirect could take the
        // alert (and the URL's secret) elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the webhook client; alerts stay in the outbox");
            return Vec::new();
        }
    };
    let mut tasks = vec![tokio::spawn(drop_unknown(alerts.clone()))];
    for hook in &alerts.config.webhooks {
        tasks.push(tokio::spawn(deliver_to(
            hook.clone(),
            alerts.clone(),
            storage.clone(),
            client.clone(),
        )));
    }
    tasks
}

/// Deliveries for webhooks no longer given at start are dropped, once.
async fn drop_unknown(alerts: Arc<Alerts>) {
    let found = {
        let alerts = alerts.clone();
        tokio::task::spawn_blocking(move || alerts.outbox.pending()).await
    };
    let Ok(Ok(pending)) = found else {
        return;
    };
    for p in pending {
        if !alerts
            .config
            .webhooks
            .iter()
            .any(|w| w.url == p.delivery.url)
        {
            tracing::warn!(
                title = %p.delivery.title,
                "dropped an alert for a webhook this server was not started with"
            );
            alerts.outbox.remove(&p);
        }
    }
}

async fn deliver_to(
    hook: Webhook,
    alerts: Arc<Alerts>,
    storage: Arc<dyn Storage>,
    client: reqwest::Client,
) {
    let shown = hook.shown();
    let mut written = alerts.written.subscribe();
    let mut backoff = FIRST_BACKOFF;
    loop {
        written.mark_unchanged();
        let mut retry_at = None;
        let pending = {
            let alerts = alerts.clone();
            tokio::task::spawn_blocking(move || alerts.outbox.pending()).await
        };
        let pending = match pending {
            Ok(Ok(pending)) => pending,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read the alert outbox");
                Vec::new()
            }
            Err(_) => return,
        };
        for p in pending.into_iter().filter(|p| p.delivery.url == hook.url) {
            let age = crate::api::now() - p.delivery.raised;
            if age > GIVE_UP_AFTER {
                let text = format!(
                    "gave up posting the alert to {shown}: not taken in {:.0} hours",
                    GIVE_UP_AFTER / 3600.0
                );
                finish(&alerts, &storage, p, "alert_failed", text).await;
                continue;
            }
            match post(&client, &hook, &p).await {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    let text = format!("posted to {shown}");
                    finish(&alerts, &storage, p, "alert_sent", text).await;
                }
                Err(why) => {
                    tracing::warn!(
                        webhook = %shown,
                        error = %why,
                        retry_in = ?backoff,
                        "an alert was not taken; it stays in the outbox"
                    );
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    break;
                }
            }
        }
        let wake = retry_at.unwrap_or_else(|| Instant::now() + IDLE_CHECK);
        // A new alert does not cut a backoff short: the receiver failed.
        if retry_at.is_some() {
            tokio::time::sleep_until(wake).await;
        } else {
            tokio::select! {
                changed = written.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

async fn post(client: &reqwest::Client, hook: &Webhook, p: &Pending) -> Result<(), String> {
    let response = client
        .post(&hook.url)
        .json(&p.delivery.body)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                format!("no answer within {POST_TIMEOUT:?}")
            } else {
                format!("cannot reach it: {e}")
            }
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    if status.is_redirection() {
        return Err(format!(
            "it answered {status}; redirects are not followed: give the webhook's final URL"
        ));
    }
    let mut response = response;
    let mut answer = Vec::new();
    while answer.len() < MAX_ANSWER_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ANSWER_READ - answer.len();
                answer.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    // Dropping the response closes the connection on the rest of it.
    let body: String = String::from_utf8_lossy(&answer).chars().take(200).collect();
    Err(format!("it answered {status}: {body}"))
}

/// Records how a delivery ended, then removes it from the outbox.
async fn finish(
    alerts: &Arc<Alerts>,
    storage: &Arc<dyn Storage>,
    p: Pending,
    kind: &'static str,
    text: String,
) {
    let alerts = alerts.clone();
    let storage = storage.clone();
    let _ = tokio::task::spawn_blocking(move || {
        alerts.record(storage.as_ref(), &p.delivery, kind, text);
        alerts.outbox.remove(&p);
    })
    .await;
}
