//! Every operation through the async client against the real server, over
//! loopback TCP, including deferred WAIT and BARRIER replies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Raw, client, eventually, server};
use relaunch_store::wire::{Request, STOP_WAITING, WAIT_CANCELED};
use relaunch_store::{ErrorKind, StoreError};

#[tokio::test]
async fn set_get_add_compare_set_delete_append() {
    let server = server().await;
    let c = client(&server).await;

    c.set("k", "v").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v");
    assert_eq!(
        c.get_now("missing").await.unwrap(),
        b"",
        "GET of a missing key is empty"
    );

    assert_eq!(c.add("n", 5).await.unwrap(), 5);
    assert_eq!(c.add("n", -7).await.unwrap(), -2);
    assert_eq!(c.get("n").await.unwrap(), b"-2", "ADD stores decimal text");

    assert_eq!(c.compare_set("k", "v", "w").await.unwrap(), b"w");
    assert_eq!(
        c.compare_set("k", "v", "x").await.unwrap(),
        b"w",
        "mismatch returns current"
    );
    assert_eq!(
        c.compare_set("new", "", "d").await.unwrap(),
        b"d",
        "empty expected creates"
    );
    assert_eq!(
        c.compare_set("none", "e", "d").await.unwrap(),
        b"e",
        "missing key returns expected"
    );
    assert!(!c.check(&["none"]).await.unwrap());

    c.append("k", "yz").await.unwrap();
    c.append("fresh", "a").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"wyz");
    assert_eq!(c.get("fresh").await.unwrap(), b"a");

    assert_eq!(c.num_keys().await.unwrap(), 4);
    assert!(c.delete_key("k").await.unwrap());
    assert!(!c.delete_key("k").await.unwrap());
    assert_eq!(c.num_keys().await.unwrap(), 3);

    let mut keys = c.list_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, [b"fresh".to_vec(), b"n".to_vec(), b"new".to_vec()]);
    c.ping().await.unwrap();
}

#[tokio::test]
async fn multi_get_and_multi_set() {
    let server = server().await;
    let c = client(&server).await;
    c.multi_set(&[("a", "1"), ("b", ""), ("c", "3")])
        .await
        .unwrap();
    assert_eq!(
        c.multi_get(&["c", "b", "a"]).await.unwrap(),
        [b"3".to_vec(), b"".to_vec(), b"1".to_vec()]
    );
    assert!(c.check(&["a", "b", "c"]).await.unwrap());
    assert!(!c.check(&["a", "zz"]).await.unwrap());
    assert!(
        c.check::<&str>(&[]).await.unwrap(),
        "no keys are trivially ready"
    );
}

#[tokio::test]
async fn binary_keys_and_values_roundtrip() {
    let server = server().await;
    let c = client(&server).await;
    let key: Vec<u8> = (0..=255).collect();
    let value: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 256) as u8).collect();
    c.set(&key, &value).await.unwrap();
    assert_eq!(c.get(&key).await.unwrap(), value);
}

#[tokio::test]
async fn queues() {
    let server = server().await;
    let c = client(&server).await;
    assert_eq!(c.queue_len("q").await.unwrap(), 0);
    let empty = c.queue_pop("q", false).await.unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::NotFound);
    c.queue_push("q", "one").await.unwrap();
    c.queue_push("q", "two").await.unwrap();
    assert_eq!(c.queue_len("q").await.unwrap(), 2);
    assert!(
        c.check(&["q"]).await.unwrap(),
        "a non-empty queue counts as ready"
    );
    assert_eq!(c.queue_pop("q", true).await.unwrap(), b"one");
    assert_eq!(c.queue_pop("q", false).await.unwrap(), b"two");
    assert_eq!(c.num_keys().await.unwrap(), 0, "queues are not keys");

    // A blocking pop waits for the push of another client.
    let popper = client(&server).await;
    let pop = tokio::spawn(async move { popper.queue_pop("work", true).await });
    eventually("the pop to wait", || server.stats().pending_waits == 1).await;
    c.queue_push("work", "item").await.unwrap();
    assert_eq!(pop.await.unwrap().unwrap(), b"item");
}

/// Each of these makes a missing key exist, so each must release a waiter.
#[tokio::test]
async fn every_creating_op_releases_waiters() {
    let server = server().await;
    let c = client(&server).await;
    type MakeRequest = Box<dyn Fn(&str) -> Request<'_>>;
    let ops: Vec<(&str, MakeRequest)> = vec![
        (
            "SET",
            Box::new(|k| Request::Set {
                key: k.as_bytes(),
                value: b"v",
            }),
        ),
        (
            "ADD",
            Box::new(|k| Request::Add {
                key: k.as_bytes(),
                delta: 1,
            }),
        ),
        (
            "APPEND",
            Box::new(|k| Request::Append {
                key: k.as_bytes(),
                value: b"v",
            }),
        ),
        (
            "COMPARE_SET",
            Box::new(|k| Request::CompareSet {
                key: k.as_bytes(),
                expected: b"",
                desired: b"v",
            }),
        ),
        (
            "MULTI_SET",
            Box::new(|k| Request::MultiSet {
                pairs: vec![(k.as_bytes(), b"v")],
            }),
        ),
        (
            "QUEUE_PUSH",
            Box::new(|k| Request::QueuePush {
                key: k.as_bytes(),
                value: b"v",
            }),
        ),
    ];
    for (name, op) in ops {
        let key = format!("released-by-{name}");
        let mut waiter = Raw::validated(&server).await;
        waiter
            .send(&Request::Wait {
                keys: vec![key.as_bytes()],
            })
            .await;
        eventually("the wait to register", || server.stats().pending_waits == 1).await;
        assert!(
            waiter.silent_for(Duration::from_millis(20)).await,
            "{name}: released too early"
        );
        let mut actor = Raw::validated(&server).await;
        actor.send(&op(&key)).await;
        assert_eq!(
            waiter.read_exact(1).await,
            [STOP_WAITING],
            "{name} released the waiter"
        );
        assert_eq!(server.stats().pending_waits, 0);
        drop(c.ping().await);
    }
}

#[tokio::test]
async fn failed_compare_set_and_delete_release_no_one() {
    let server = server().await;
    let c = client(&server).await;
    let mut waiter = Raw::validated(&server).await;
    waiter.send(&Request::Wait { keys: vec![b"k"] }).await;
    eventually("the wait to register", || server.stats().pending_waits == 1).await;
    assert_eq!(
        c.compare_set("k", "not-empty", "x").await.unwrap(),
        b"not-empty"
    );
    c.delete_key("k").await.unwrap();
    assert!(waiter.silent_for(Duration::from_millis(100)).await);
    c.set("k", "now").await.unwrap();
    assert_eq!(waiter.read_exact(1).await, [STOP_WAITING]);
}

#[tokio::test]
async fn wait_for_several_keys_releases_after_the_last() {
    let server = server().await;
    let setter = client(&server).await;
    let waiter = client(&server).await;
    let wait = tokio::spawn(async move { waiter.wait(&["a", "b", "c"], common::SHORT).await });
    eventually("the wait to register", || server.stats().pending_waits == 1).await;
    setter.set("a", "").await.unwrap();
    setter.set("c", "").await.unwrap();
    assert_eq!(server.stats().pending_waits, 1, "b is still missing");
    setter.add("b", 1).await.unwrap();
    wait.await.unwrap().unwrap();
    assert_eq!(server.stats().watched_keys, 0);
}

#[tokio::test]
async fn wait_timeout_cancels_and_the_connection_stays_usable() {
    let server = server().await;
    let c = client(&server).await;
    let err = c
        .wait(&["never"], Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Timeout { .. }), "{err}");
    assert!(
        err.to_string().contains("\"never\""),
        "names the key: {err}"
    );
    assert_eq!(
        server.stats().pending_waits,
        0,
        "the server forgot the wait"
    );
    // Same connection, still in sync.
    assert_eq!(server.stats().connections, 1);
    assert_eq!(c.add("x", 2).await.unwrap(), 2);
    assert_eq!(server.stats().connections, 1);
}

#[tokio::test]
async fn cancel_wait_without_a_wait_answers_canceled() {
    let server = server().await;
    let mut raw = Raw::validated(&server).await;
    raw.send(&Request::CancelWait).await;
    assert_eq!(raw.read_exact(1).await, [WAIT_CANCELED]);
}

#[tokio::test]
async fn a_release_racing_a_cancel_is_delivered_before_the_cancel_reply() {
    let server = server().await;
    let mut raw = Raw::validated(&server).await;
    // WAIT, then SET of its key and CANCEL_WAIT in one segment: the release
    // happens inside the batch, before the cancel.
    let mut bytes = Vec::new();
    let limits = Default::default();
    for r in [
        Request::Wait { keys: vec![b"k"] },
        Request::Set {
            key: b"k",
            value: b"",
        },
        Request::CancelWait,
    ] {
        r.encode(&limits, &mut bytes).unwrap();
    }
    raw.send_bytes(&bytes).await.unwrap();
    assert_eq!(raw.read_exact(2).await, [STOP_WAITING, WAIT_CANCELED]);
}

#[tokio::test]
async fn get_waits_for_the_key_like_torch() {
    let server = server().await;
    let setter = client(&server).await;
    let getter = client(&server).await;
    let get = tokio::spawn(async move { getter.get("late").await });
    eventually("the get to wait", || server.stats().pending_waits == 1).await;
    setter.set("late", "value").await.unwrap();
    assert_eq!(get.await.unwrap().unwrap(), b"value");
}

#[tokio::test]
async fn barrier_releases_everyone_when_the_last_arrives() {
    let server = server().await;
    const N: usize = 8;
    let mut tasks = Vec::new();
    for _ in 0..N - 1 {
        let c = client(&server).await;
        tasks.push(tokio::spawn(async move {
            c.barrier("bar", N as i64, common::SHORT).await
        }));
    }
    eventually("N-1 arrivals", || server.stats().pending_waits == N - 1).await;
    let last = client(&server).await;
    last.barrier("bar", N as i64, common::SHORT).await.unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(last.get("bar").await.unwrap(), N.to_string().as_bytes());
    assert_eq!(server.stats().pending_waits, 0);
}

#[tokio::test]
async fn barrier_timeout_is_a_timeout_and_leaves_no_waiter() {
    let server = server().await;
    let c = client(&server).await;
    let err = c
        .barrier("lonely", 2, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(server.stats().pending_waits, 0);
    assert_eq!(server.stats().watched_keys, 0);
}

#[tokio::test]
async fn concurrent_clients_count_exactly() {
    let server = server().await;
    const CLIENTS: usize = 32;
    const ADDS: usize = 200;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = client(&server).await;
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::with_capacity(ADDS);
            for _ in 0..ADDS {
                seen.push(c.add("counter", 1).await.unwrap());
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    let expected: Vec<i64> = (1..=(CLIENTS * ADDS) as i64).collect();
    assert_eq!(all, expected, "every ADD saw a distinct count");
}

#[tokio::test]
async fn a_dropped_call_does_not_desynchronize_the_client() {
    let server = server().await;
    let c = Arc::new(client(&server).await);
    // Drop a GET while it waits for a key; its late reply must not be read
    // as the answer to the next call.
    let pending = c.get("soon");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), pending)
            .await
            .is_err()
    );
    c.set("soon", "v").await.unwrap();
    assert_eq!(c.add("n", 41).await.unwrap(), 41);
    assert_eq!(c.get("soon").await.unwrap(), b"v");
}

#[tokio::test]
async fn the_client_connects_to_a_server_that_starts_late() {
    // Reserve a port, release it, then start the server on it after the
    // client has begun to retry.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let connecting = tokio::spawn(async move {
        let options = relaunch_store::ClientOptions {
            connect_timeout: common::SHORT,
            ..Default::default()
        };
        relaunch_store::StoreClient::connect("127.0.0.1", port, options).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let options = relaunch_store::ServerOptions {
        host: Some("127.0.0.1".into()),
        port,
        ..Default::default()
    };
    let server = relaunch_store::StoreServer::bind(&options)
        .await
        .unwrap()
        .spawn()
        .unwrap();
    let c = connecting.await.unwrap().unwrap();
    c.ping().await.unwrap();
    drop(server);
}

#[tokio::test]
async fn connecting_to_nothing_fails_with_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let options = relaunch_store::ClientOptions {
        connect_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let err = relaunch_store::StoreClient::connect("127.0.0.1", port, options)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    let message = err.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(message.contains("relaunch store serve"), "{message}");
}

#[tokio::test]
async fn localhost_listens_on_every_loopback_address() {
    let options = relaunch_store::ServerOptions {
        host: Some("localhost".into()),
        port: 0,
        ..Default::default()
    };
    let server = relaunch_store::StoreServer::bind(&options)
        .await
        .unwrap()
        .spawn()
        .unwrap();
    let port = server.port();
    for addr in server.local_addrs() {
        assert_eq!(addr.port(), port, "one port for every address");
        assert!(addr.ip().is_loopback());
        let c =
            relaunch_store::StoreClient::connect(addr.ip().to_string(), port, Default::default())
                .await
                .unwrap();
        c.ping().await.unwrap();
    }
}

#[tokio::test]
async fn shutdown_closes_connections_and_clients_see_it() {
    let server = server().await;
    let c = client(&server).await;
    let waiter = client(&server).await;
    let wait = tokio::spawn(async move { waiter.wait(&["never"], common::SHORT).await });
    eventually("the wait to register", || server.stats().pending_waits == 1).await;
    server.shutdown().await;
    let err = wait.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let err = c.add("x", 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
}

#[tokio::test]
async fn ipv6_loopback_works_where_the_machine_has_it() {
    let options = relaunch_store::ServerOptions {
        host: Some("::1".into()),
        port: 0,
        ..Default::default()
    };
    let server = match relaunch_store::StoreServer::bind(&options).await {
        Ok(server) => server.spawn().unwrap(),
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback here ({e})");
            return;
        }
    };
    assert!(server.local_addrs().iter().all(|a| a.is_ipv6()));
    let c = relaunch_store::StoreClient::connect("::1", server.port(), Default::default())
        .await
        .unwrap();
    assert_eq!(c.add("v6", 1).await.unwrap(), 1);
}
