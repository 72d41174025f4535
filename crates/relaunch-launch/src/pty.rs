//! Pseudo-terminals for workers whose output the launcher shows on a
//! terminal (`relaunch run --worker-tty`).
//!
//! Under torchrun a worker writes straight to the user's terminal, so Rich
//! and tqdm draw live bars in colour. A worker of ours writes through the
//! launcher (prefixes, log files, the tracker), and a pipe would make those
//! libraries fall back to printing once per epoch without colour. A
//! pseudo-terminal per stream gives the worker a terminal as wide as the
//! launcher's less the prefix; [`crate::vterm`] makes sense of what it
//! draws.
//!
//! The pseudo-terminal is never the worker's controlling terminal (no
//! `TIOCSCTTY`): a Ctrl-C still reaches only the launcher, which forwards it
//! once, and closing the launcher's end sends no SIGHUP. Both ends are
//! close-on-exec from the start, so no other child of the launcher holds a
//! worker's end and delays the end of its output.

use std::io::{self, IsTerminal as _};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::net::unix::pipe;

/// A terminal's size in cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    pub columns: u16,
    pub rows: u16,
}

/// Columns a worker's terminal keeps at least, however long the prefix.
const MIN_COLUMNS: u16 = 20;

impl Size {
    /// The size of the launcher's terminal (stdout's, else stderr's), or
    /// 80 x 24 where neither is one (`--worker-tty always` into a pipe).
    pub fn of_launcher() -> Self {
        let measured = [io::stdout().as_fd(), io::stderr().as_fd()]
            .into_iter()
            .find_map(|fd| rustix::termios::tcgetwinsize(fd).ok())
            .filter(|w| w.ws_col > 0 && w.ws_row > 0);
        match measured {
            Some(w) => Self {
                columns: w.ws_col,
                rows: w.ws_row,
            },
            None => Self {
                columns: 80,
                rows: 24,
            },
        }
    }

    /// This size less `columns` (a prefix's width), keeping at least
    /// [`MIN_COLUMNS`].
    pub fn less(self, columns: usize) -> Self {
        let columns = u16::try_from(columns).unwrap_or(u16::MAX);
        Self {
            columns: self.columns.saturating_sub(columns).max(MIN_COLUMNS),
            rows: self.rows,
        }
    }
}

/// Whether the launcher's own stream is a terminal.
pub fn launcher_has_terminal(stdout: bool) -> bool {
    if stdout {
        io::stdout().is_terminal()
    } else {
        io::stderr().is_terminal()
    }
}

/// One pseudo-terminal: the worker writes to `worker`; the launcher reads
/// what it wrote from `reader`.
#[derive(Debug)]
pub struct Pty {
    pub reader: pipe::Receiver,
    pub worker: OwnedFd,
}

/// Opens a pseudo-terminal of `size`. Must be called within the Tokio
/// runtime (the reader is registered with it).
pub fn open(size: Size) -> io::Result<Pty> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let worker = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(fd) => fd,
        // Kernels before 4.13: open the worker's end by its name.
        Err(_) => {
            let name = rustix::pty::ptsname(&master, Vec::new())?;
            rustix::fs::open(
                name.as_c_str(),
                OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
                Mode::empty(),
            )?
        }
    };
    rustix::termios::tcsetwinsize(
        &worker,
        Winsize {
            ws_row: size.rows,
            ws_col: size.columns,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    let status = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, status | OFlags::NONBLOCK)?;
    let reader = pipe::Receiver::from_owned_fd_unchecked(master)?;
    Ok(Pty { reader, worker })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;

    #[test]
    fn sizes_keep_room_for_the_output() {
        let size = Size {
            columns: 100,
            rows: 30,
        };
        assert_eq!(size.less(12).columns, 88);
        assert_eq!(size.less(95).columns, MIN_COLUMNS);
        assert_eq!(size.less(usize::MAX).rows, 30);
    }

    /// What the worker's end is written arrives, with the terminal's
    /// `\r\n`, and closing that end reads as the end (EIO from the kernel).
    /// (No child process: the orphan tests of this crate kill this
    /// process's children.)
    #[tokio::test]
    async fn the_worker_end_is_a_terminal_of_the_size_given_and_its_output_arrives() {
        let size = Size {
            columns: 73,
            rows: 19,
        };
        let Pty { mut reader, worker } = open(size).unwrap();
        assert!(rustix::termios::isatty(&worker));
        let got = rustix::termios::tcgetwinsize(&worker).unwrap();
        assert_eq!((got.ws_col, got.ws_row), (73, 19));
        let flags = rustix::io::fcntl_getfd(&worker).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        let mut file = std::fs::File::from(worker);
        std::io::Write::write_all(&mut file, b"one\ntwo").unwrap();
        drop(file);
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(String::from_utf8_lossy(&got), "one\r\ntwo");
    }
}
