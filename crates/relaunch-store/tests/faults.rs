//! Bad input and abrupt disconnects: each closes or cleans up one connection
//! and nothing else; the server keeps answering everyone else correctly and
//! keeps no state for connections that are gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Raw, client, eventually, server, server_with};
use rand::{Rng, SeedableRng};
use relaunch_store::wire::{Command, Limits, Request, STOP_WAITING, put_bytes, put_u64};

/// Asserts that `frame`, sent after VALIDATE, makes the server close that
/// connection, while a bystander keeps getting correct answers.
async fn closes_only_the_offender(
    server: &relaunch_store::RunningServer,
    frame: &[u8],
    what: &str,
) {
    let bystander = client(server).await;
    bystander.set("stable", "yes").await.unwrap();
    let before = server.stats().connections;
    let mut offender = Raw::validated(server).await;
    let _ = offender.send_bytes(frame).await;
    assert!(
        offender.closed_by_server().await,
        "{what}: connection not closed"
    );
    assert_eq!(bystander.get("stable").await.unwrap(), b"yes", "{what}");
    assert!(bystander.add("after", 1).await.unwrap() > 0, "{what}");
    eventually("the offender to be forgotten", || {
        server.stats().connections <= before
    })
    .await;
}

#[tokio::test]
async fn unknown_command_closes_the_connection() {
    let server = server().await;
    for byte in [19u8, 0x7f, 0xff] {
        closes_only_the_offender(&server, &[byte], &format!("command {byte}")).await;
    }
}

#[tokio::test]
async fn oversized_key_value_count_and_frame_close_the_connection() {
    let limits = Limits {
        max_key_bytes: 64,
        max_value_bytes: 1024,
        max_keys: 16,
        max_frame_bytes: 4096,
    };
    let server = server_with(limits).await;

    let mut key_too_long = vec![Command::Get as u8];
    put_bytes(&mut key_too_long, &[b'k'; 65]);
    closes_only_the_offender(&server, &key_too_long, "long key").await;

    // Only the length is sent: the server must refuse on the header alone.
    let mut value_too_large = vec![Command::Set as u8];
    put_bytes(&mut value_too_large, b"k");
    put_u64(&mut value_too_large, 1 << 40);
    closes_only_the_offender(&server, &value_too_large, "huge value").await;

    let mut too_many_keys = vec![Command::Wait as u8];
    put_u64(&mut too_many_keys, 17);
    closes_only_the_offender(&server, &too_many_keys, "many keys").await;

    let mut frame_too_large = vec![Command::MultiSet as u8];
    put_u64(&mut frame_too_large, 16);
    for i in 0..16u8 {
        put_bytes(&mut frame_too_large, &[i]);
        put_bytes(&mut frame_too_large, &[0; 1000]);
    }
    closes_only_the_offender(&server, &frame_too_large, "large frame").await;
}

#[tokio::test]
async fn the_default_limits_are_pytorchs() {
    let server = server().await;
    let c = client(&server).await;
    // The largest value PyTorch accepts is accepted.
    let value = vec![7u8; 8 * 1024 * 1024];
    c.set("big", &value).await.unwrap();
    assert_eq!(c.get("big").await.unwrap().len(), value.len());
    // One byte more is refused by our client before it is sent...
    let too_big = vec![7u8; 8 * 1024 * 1024 + 1];
    let err = c.set("bigger", &too_big).await.unwrap_err();
    assert!(err.to_string().contains("max_value_bytes"), "{err}");
    // ...and by the server when a client sends it anyway.
    let mut frame = vec![Command::Set as u8];
    put_bytes(&mut frame, b"bigger");
    put_u64(&mut frame, too_big.len() as u64);
    closes_only_the_offender(&server, &frame, "8 MiB + 1").await;
}

#[tokio::test]
async fn handshake_violations_close_the_connection() {
    let server = server().await;
    let bystander = client(&server).await;

    // No VALIDATE first.
    let mut raw = Raw::connect(&server).await;
    raw.send(&Request::GetNumKeys).await;
    assert!(raw.closed_by_server().await);

    // Wrong magic.
    let mut raw = Raw::connect(&server).await;
    raw.send(&Request::Validate { magic: 0xdead_beef }).await;
    assert!(raw.closed_by_server().await);

    // VALIDATE twice.
    let mut raw = Raw::validated(&server).await;
    raw.send(&Request::Validate {
        magic: relaunch_store::wire::VALIDATION_MAGIC,
    })
    .await;
    assert!(raw.closed_by_server().await);

    // An HTTP request, as from a misconfigured health check.
    let mut raw = Raw::connect(&server).await;
    raw.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(raw.closed_by_server().await);

    bystander.ping().await.unwrap();
}

#[tokio::test]
async fn add_on_text_closes_only_that_connection_and_keeps_the_value() {
    let server = server().await;
    let c = client(&server).await;
    c.set("text", "abc").await.unwrap();
    let mut add = vec![Command::Add as u8];
    put_bytes(&mut add, b"text");
    add.extend_from_slice(&1i64.to_le_bytes());
    closes_only_the_offender(&server, &add, "ADD on text").await;
    assert_eq!(
        c.get("text").await.unwrap(),
        b"abc",
        "accepted data is kept"
    );
}

#[tokio::test]
async fn a_second_wait_on_one_connection_is_refused() {
    let server = server().await;
    let mut raw = Raw::validated(&server).await;
    raw.send(&Request::Wait { keys: vec![b"a"] }).await;
    raw.send(&Request::Wait { keys: vec![b"b"] }).await;
    assert!(raw.closed_by_server().await);
    eventually("the waits to be forgotten", || {
        let s = server.stats();
        s.pending_waits == 0 && s.watched_keys == 0
    })
    .await;
}

#[tokio::test]
async fn disconnect_mid_wait_and_mid_barrier_cleans_up() {
    let server = server().await;
    let c = client(&server).await;
    let mut waiters = Vec::new();
    for i in 0..20 {
        let mut raw = Raw::validated(&server).await;
        if i % 2 == 0 {
            raw.send(&Request::Wait {
                keys: vec![b"never", b"also-never"],
            })
            .await;
        } else {
            raw.send(&Request::Barrier {
                key: b"bar",
                world_size: 1000,
            })
            .await;
        }
        waiters.push(raw);
    }
    eventually("20 pending waits", || server.stats().pending_waits == 20).await;
    drop(waiters);
    eventually("every wait forgotten", || {
        let s = server.stats();
        s.pending_waits == 0 && s.watched_keys == 0 && s.connections == 1
    })
    .await;
    // The keys they waited for still work for others.
    c.set("never", "").await.unwrap();
    c.set("also-never", "").await.unwrap();
    c.wait(&["never", "also-never"], common::SHORT)
        .await
        .unwrap();
}

#[tokio::test]
async fn disconnect_mid_request_leaves_nothing_behind() {
    let server = server().await;
    let c = client(&server).await;
    let mut raw = Raw::validated(&server).await;
    let mut partial = vec![Command::Set as u8];
    put_bytes(&mut partial, b"half");
    put_u64(&mut partial, 1000);
    partial.extend_from_slice(&[1; 10]);
    raw.send_bytes(&partial).await.unwrap();
    drop(raw);
    eventually("the connection to close", || {
        server.stats().connections == 1
    })
    .await;
    assert!(
        !c.check(&["half"]).await.unwrap(),
        "a partial SET is not applied"
    );
}

#[tokio::test]
async fn pipelined_requests_split_at_every_byte_are_answered_in_order() {
    let server = server().await;
    let mut raw = Raw::validated(&server).await;
    let limits = Limits::default();
    let mut bytes = Vec::new();
    let requests = [
        Request::Set {
            key: b"k",
            value: b"v",
        },
        Request::Add {
            key: b"n",
            delta: 3,
        },
        Request::Get { key: b"k" },
        Request::Check {
            keys: vec![b"k", b"n"],
        },
        Request::Ping { nonce: 9 },
    ];
    for r in &requests {
        r.encode(&limits, &mut bytes).unwrap();
    }
    // One byte per write: the server must reassemble every request.
    for b in &bytes {
        raw.send_bytes(std::slice::from_ref(b)).await.unwrap();
    }
    let mut expected = Vec::new();
    expected.extend_from_slice(&3i64.to_le_bytes());
    put_bytes(&mut expected, b"v");
    expected.push(0);
    expected.extend_from_slice(&9u32.to_le_bytes());
    assert_eq!(raw.read_exact(expected.len()).await, expected);
}

/// Many connections send random frames (random command bytes with random
/// lengths and payloads) while a well-behaved client checks every answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_many_connections_never_disturbs_a_good_client() {
    const ATTACKERS: usize = 64;
    const ROUNDS: usize = 30;
    let limits = Limits {
        max_frame_bytes: 1 << 20,
        ..Limits::default()
    };
    let server = server_with(limits).await;
    let port = server.port();
    let started = Instant::now();

    let mut attackers = Vec::new();
    for seed in 0..ATTACKERS as u64 {
        attackers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            for _ in 0..ROUNDS {
                let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let mut frame = Vec::new();
                if rng.random_bool(0.7) {
                    // Validated, so the garbage reaches the command parser.
                    frame.extend_from_slice(&[0, 0xce, 0xf7, 0x85, 0x3c]);
                }
                for _ in 0..rng.random_range(1..6) {
                    frame.push(rng.random_range(0..24));
                    let len: u64 = match rng.random_range(0..4) {
                        0 => rng.random_range(0..16),
                        1 => rng.random_range(0..100_000),
                        2 => rng.random(),
                        _ => 1 << 63,
                    };
                    frame.extend_from_slice(&len.to_le_bytes());
                    let junk = rng.random_range(0..2048);
                    frame.extend((0..junk).map(|_| rng.random::<u8>()));
                }
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let _ = s.write_all(&frame).await;
                if rng.random_bool(0.5) {
                    // Sometimes read what comes back until the server closes.
                    let mut sink = [0u8; 4096];
                    let _ =
                        tokio::time::timeout(Duration::from_millis(20), s.read(&mut sink)).await;
                }
            }
        }));
    }

    let good = client(&server).await;
    let mut checked = 0;
    while attackers.iter().any(|a| !a.is_finished()) {
        checked += 1;
        let key = format!("good/{checked}");
        good.set(&key, checked.to_string()).await.unwrap();
        assert_eq!(
            good.get(&key).await.unwrap(),
            checked.to_string().as_bytes()
        );
        assert_eq!(good.add("good/count", 1).await.unwrap(), checked);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "bounded in time"
        );
    }
    for a in attackers {
        a.await.unwrap();
    }
    assert!(checked > 0);
    // Garbage may have created keys and waits; once the attackers are gone,
    // none of their waits or connections remain.
    eventually("attackers forgotten", || {
        let s = server.stats();
        s.connections == 1 && s.pending_waits == 0 && s.watched_keys == 0
    })
    .await;
    assert_eq!(
        good.get("good/count").await.unwrap(),
        checked.to_string().as_bytes()
    );
}

#[tokio::test]
async fn a_thousand_waiters_are_released_by_one_set() {
    let server = server().await;
    const N: usize = 1000;
    let mut waiters = Vec::with_capacity(N);
    for _ in 0..N {
        let mut raw = Raw::validated(&server).await;
        raw.send(&Request::Wait { keys: vec![b"go"] }).await;
        waiters.push(raw);
    }
    eventually("every wait registered", || {
        server.stats().pending_waits == N
    })
    .await;
    let c = client(&server).await;
    c.set("go", "").await.unwrap();
    for w in &mut waiters {
        assert_eq!(w.read_exact(1).await, [STOP_WAITING]);
    }
    assert_eq!(server.stats().pending_waits, 0);
}
