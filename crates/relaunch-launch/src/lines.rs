//! Splits a worker's output stream into whole lines and progress redraws.
//!
//! Progress bars (tqdm and friends) redraw one line with carriage returns:
//! `\r 10%|#  |`, `\r 20%|## |`, ..., `\r100%|###|\n`. Each frame between
//! two `\r` is a [`Piece::Progress`]; what stands on the line when the `\n`
//! comes is a [`Piece::Line`]. Log files keep only lines, so they hold the
//! bar's final state instead of thousands of redraws. `\r\n` is an ordinary
//! line end.

/// A line longer than this is cut into pieces of this size, so one worker
/// that never prints a newline cannot make the launcher buffer without end.
pub const MAX_LINE: usize = 64 * 1024;

/// One unit of output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// A finished line, without its line end.
    Line(Vec<u8>),
    /// A progress frame that the next `\r` will overwrite.
    Progress(Vec<u8>),
    /// A finished line of a worker that writes to a terminal
    /// ([`crate::vterm`]): its text, and as drawn (with its colours).
    Drawn { text: Vec<u8>, drawn: Vec<u8> },
    /// The lines such a worker may still redraw, as drawn, in place of the
    /// last ones reported (none: nothing live).
    Live(Vec<Vec<u8>>),
}

impl Piece {
    /// The text of a finished line, as log files keep it.
    pub fn finished_text(&self) -> Option<&[u8]> {
        match self {
            Self::Line(line) => Some(line),
            Self::Drawn { text, .. } => Some(text),
            Self::Progress(_) | Self::Live(_) => None,
        }
    }
}

/// Incremental splitter: feed bytes as they arrive, in any chunks.
#[derive(Debug, Default)]
pub struct LineSplitter {
    /// The text on the current line since its last `\r`.
    current: Vec<u8>,
    /// A `\r` was the last byte seen; a `\n` next makes it a line end.
    carriage_return: bool,
}

impl LineSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Splits `data`, appending what it completes to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<Piece>) {
        for &byte in data {
            if self.carriage_return {
                self.carriage_return = false;
                if byte == b'\n' {
                    out.push(Piece::Line(std::mem::take(&mut self.current)));
                    continue;
                }
                // A redraw: the frame before the `\r` is complete.
                if !self.current.is_empty() {
                    out.push(Piece::Progress(std::mem::take(&mut self.current)));
                }
            }
            match byte {
                b'\n' => out.push(Piece::Line(std::mem::take(&mut self.current))),
                b'\r' => self.carriage_return = true,
                _ => {
                    self.current.push(byte);
                    if self.current.len() >= MAX_LINE {
                        out.push(Piece::Line(std::mem::take(&mut self.current)));
                    }
                }
            }
        }
    }

    /// The stream ended: whatever is on the current line is its last line.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        self.carriage_return = false;
        if !self.current.is_empty() {
            out.push(Piece::Line(std::mem::take(&mut self.current)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<Piece> {
        let mut s = LineSplitter::new();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    fn line(s: &str) -> Piece {
        Piece::Line(s.as_bytes().to_vec())
    }

    fn progress(s: &str) -> Piece {
        Piece::Progress(s.as_bytes().to_vec())
    }

    #[test]
    fn lines_in_any_chunks() {
        let whole = split(&[b"one\ntwo\n"]);
        assert_eq!(whole, [line("one"), line("two")]);
        let bytewise: Vec<&[u8]> = b"one\ntwo\n".chunks(1).collect();
        assert_eq!(split(&bytewise), whole);
        assert_eq!(split(&[b"no newline"]), [line("no newline")]);
        assert_eq!(split(&[b"\n\n"]), [line(""), line("")]);
    }

    #[test]
    fn crlf_is_a_line_end_even_across_chunks() {
        assert_eq!(split(&[b"a\r\nb\r", b"\n"]), [line("a"), line("b")]);
    }

    #[test]
    fn a_tqdm_bar_becomes_frames_then_its_final_line() {
        let out = split(&[b"\r  0%|   |", b"\r 50%|#  |\r100%|###|\n", b"done\n"]);
        assert_eq!(
            out,
            [
                progress("  0%|   |"),
                progress(" 50%|#  |"),
                line("100%|###|"),
                line("done")
            ]
        );
    }

    #[test]
    fn overlong_lines_are_cut() {
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let out = split(&[&long]);
        assert_eq!(out.len(), 3);
        assert!(matches!(&out[2], Piece::Line(l) if l.len() == 5));
    }
}
