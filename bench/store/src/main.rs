//! `store-load`: drives any TCPStore server (ours or PyTorch's) over the wire
//! protocol with many connections from one process, light enough that the
//! server, not the generator, is what gets measured. Prints one JSON object.
//!
//! ```text
//! store-load latency    --port P [--op add|get] [--iterations N]
//! store-load throughput --port P --clients N [--seconds S]
//! store-load storm      --port P --clients N
//! ```

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use relaunch_store::wire::{Limits, Request, VALIDATION_MAGIC};
use relaunch_store::{ClientOptions, StoreClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long)]
    port: u16,
    /// Tokio worker threads for the generator (0: one thread, no workers).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Round-trip latency of one client.
    Latency {
        #[arg(long, value_enum, default_value = "add")]
        op: Op,
        #[arg(long, default_value_t = 20_000)]
        iterations: usize,
    },
    /// `add` round trips per second with N concurrent clients.
    Throughput {
        #[arg(long)]
        clients: usize,
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// N connections each `add` a counter and wait on a key that the last
    /// arrival sets; reports the time until all are released.
    Storm {
        #[arg(long)]
        clients: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Op {
    Add,
    Get,
}

fn options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(60),
        connect_timeout: Duration::from_secs(60),
        ..ClientOptions::default()
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = if args.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    let json = runtime.block_on(async {
        match args.mode {
            Mode::Latency { op, iterations } => {
                latency(&args.host, args.port, op, iterations).await
            }
            Mode::Throughput { clients, seconds } => {
                throughput(&args.host, args.port, clients, seconds).await
            }
            Mode::Storm { clients } => storm(&args.host, args.port, clients).await,
        }
    })?;
    println!("{json}");
    Ok(())
}

async fn latency(host: &str, port: u16, op: Op, iterations: usize) -> anyhow::Result<String> {
    let c = StoreClient::connect(host, port, options()).await?;
    c.set("bench/value", vec![b'x'; 64]).await?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        match op {
            Op::Add => drop(c.add("bench/latency", 1).await?),
            // A plain GET: one round trip (torch's client adds a WAIT first).
            Op::Get => drop(c.get_now("bench/value").await?),
        }
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let total: Duration = samples.iter().sum();
    Ok(format!(
        r#"{{"mode":"latency","iterations":{iterations},"mean_us":{:.2},"p50_us":{:.2},"p99_us":{:.2},"ops_per_s":{:.0}}}"#,
        us(total) / iterations as f64,
        us(samples[iterations / 2]),
        us(samples[iterations * 99 / 100]),
        iterations as f64 / total.as_secs_f64(),
    ))
}

/// Opens a raw connection and does the VALIDATE/PING handshake.
async fn raw_connection(host: &str, port: u16) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let mut hello = Vec::new();
    let limits = Limits::default();
    Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode(&limits, &mut hello)?;
    Request::Ping { nonce: 7 }.encode(&limits, &mut hello)?;
    stream.write_all(&hello).await?;
    let mut nonce = [0u8; 4];
    stream.read_exact(&mut nonce).await?;
    anyhow::ensure!(u32::from_le_bytes(nonce) == 7, "bad PING reply");
    Ok(stream)
}

/// Each client sends ADD and reads its 8-byte reply, one request in flight
/// per connection as real clients do, with nothing else on the path (no
/// timers, no locks): the generator costs as little as a client can.
async fn throughput(host: &str, port: u16, clients: usize, seconds: f64) -> anyhow::Result<String> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(raw_connection(host, port).await?);
    }
    let ops = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for (i, mut stream) in conns.into_iter().enumerate() {
        let (ops, stop) = (ops.clone(), stop.clone());
        let mut request = Vec::new();
        let key = format!("bench/throughput/{}", i % 16);
        Request::Add {
            key: key.as_bytes(),
            delta: 1,
        }
        .encode(&Limits::default(), &mut request)?;
        tasks.push(tokio::spawn(async move {
            let mut reply = [0u8; 8];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                stream.write_all(&request).await?;
                stream.read_exact(&mut reply).await?;
                n += 1;
            }
            ops.fetch_add(n, Ordering::Relaxed);
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.context("client task")??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let total = ops.load(Ordering::Relaxed);
    Ok(format!(
        r#"{{"mode":"throughput","clients":{clients},"ops":{total},"seconds":{elapsed:.3},"ops_per_s":{:.0}}}"#,
        total as f64 / elapsed
    ))
}

async fn storm(host: &str, port: u16, clients: usize) -> anyhow::Result<String> {
    // Unique per run, so that repeated storms on one server do not share a count.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let run = format!("bench/storm/{}/{nanos}", std::process::id());
    let count_key = format!("{run}/count");
    let go_key = format!("{run}/go");
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (host, count_key, go_key) = (host.to_owned(), count_key.clone(), go_key.clone());
        tasks.push(tokio::spawn(async move {
            let c = StoreClient::connect(host, port, options()).await?;
            if c.add(&count_key, 1).await? == clients as i64 {
                c.set(&go_key, "1").await?;
            }
            c.wait(&[&go_key], Duration::from_secs(60)).await?;
            // Keep the connection until everyone is released, as ranks do.
            anyhow::Ok(c)
        }));
    }
    let mut kept = Vec::with_capacity(clients);
    for t in tasks {
        kept.push(t.await.context("storm task")??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(kept);
    Ok(format!(
        r#"{{"mode":"storm","clients":{clients},"seconds":{elapsed:.4}}}"#
    ))
}
