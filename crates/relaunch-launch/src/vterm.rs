//! What a worker that sees a terminal draws, turned into finished lines and
//! the lines it may still redraw.
//!
//! [`crate::lines`] handles `\r` redraws in a pipe. A program that is
//! handed a terminal ([`crate::pty`]) does more: Rich's live displays and
//! tqdm's stacked bars move the cursor up, erase and rewrite several lines,
//! and colour them. A [`Screen`] keeps the last lines a program can still
//! reach as cells with their colours, follows the cursor through them
//! (`vte` parses the escape sequences), and lets a line go as finished
//! once it is out of reach:
//!
//! - A program's *reach* is how far above its last line it has moved the
//!   cursor: 0 for plain output and `\r` bars, N-1 for an N-line display.
//!   The last reach+1 lines are live; lines above them are finished
//!   ([`Piece::Drawn`]): at once if they were only printed, after [`GRACE`]
//!   out of reach if they were redrawn (a bar: its `\n` and the cursor-up
//!   back often come in separate writes), and whenever more than
//!   [`MAX_WINDOW`] lines wait. Live lines are reported as
//!   [`Piece::Live`] for the console to draw in place.
//! - A program that hides the cursor (`ESC[?25l`, as live displays do) is
//!   about to draw something it will come back to before a first move up
//!   says how far: what it writes is held until then. Showing the cursor
//!   again ends the display, and its reach goes back to 0.
//! - The end of the stream finishes everything. A line that held text
//!   and was cleared (a bar that went away) is no line; one printed empty
//!   is.
//!
//! Lines have no width: a long line stays one line (the launcher's terminal
//! wraps it), not several rows as on a real terminal; live displays fit
//! themselves to the pseudo-terminal's width, which the launcher sets to
//! its own less the prefix. Full-screen programs (absolute positioning)
//! are not emulated beyond the lines in reach.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use unicode_width::UnicodeWidthChar as _;

use crate::lines::Piece;

/// How long a line out of reach waits before it is finished.
pub const GRACE: Duration = Duration::from_millis(100);

/// Lines kept at most: beyond, the oldest is finished at once.
pub const MAX_WINDOW: usize = 64;

/// Live lines shown at most per stream (the last ones).
pub const MAX_LIVE: usize = 16;

/// A line longer than this many cells is cut (as [`crate::lines::MAX_LINE`]).
const MAX_COLUMNS: usize = 16 * 1024;

/// The second cell of a double-width character.
const WIDE_TAIL: char = '\0';

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Color {
    #[default]
    Default,
    Indexed(u8),
    Rgb(u8, u8, u8),
}

/// SGR attributes, one bit each, in the order of their SGR codes' table.
const ATTRIBUTES: [(u8, u16); 8] = [
    (1 << 0, 1), // bold
    (1 << 1, 2), // dim
    (1 << 2, 3), // italic
    (1 << 3, 4), // underline
    (1 << 4, 5), // blink
    (1 << 5, 7), // reverse
    (1 << 6, 8), // hidden
    (1 << 7, 9), // strike-through
];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Style {
    fg: Color,
    bg: Color,
    attributes: u8,
}

impl Style {
    fn set(&mut self, code: u16, on: bool) {
        if let Some((bit, _)) = ATTRIBUTES.iter().find(|(_, c)| *c == code) {
            if on {
                self.attributes |= bit;
            } else {
                self.attributes &= !bit;
            }
        }
    }

    /// Applies one SGR sequence's parameters, e.g. `[1, 38, 5, 208]`; a
    /// group (`38:2:r:g:b`) arrives as one slice.
    fn apply(&mut self, params: &vte::Params) {
        let groups: Vec<&[u16]> = params.iter().collect();
        if groups.is_empty() {
            *self = Self::default();
            return;
        }
        let mut i = 0;
        while i < groups.len() {
            let group = groups[i];
            let code = group[0];
            i += 1;
            match code {
                0 => *self = Self::default(),
                1..=9 => self.set(code, true),
                21 => self.set(4, true),
                22 => {
                    self.set(1, false);
                    self.set(2, false);
                }
                23..=29 => self.set(code - 20, false),
                30..=37 => self.fg = Color::Indexed((code - 30) as u8),
                39 => self.fg = Color::Default,
                40..=47 => self.bg = Color::Indexed((code - 40) as u8),
                49 => self.bg = Color::Default,
                90..=97 => self.fg = Color::Indexed((code - 90 + 8) as u8),
                100..=107 => self.bg = Color::Indexed((code - 100 + 8) as u8),
                38 | 48 => {
                    // `38;5;N` / `38;2;R;G;B`, or the same joined by colons.
                    let rest: Vec<u16> = if group.len() > 1 {
                        group[1..].to_vec()
                    } else {
                        let taken: Vec<u16> = groups[i..].iter().map(|g| g[0]).collect();
                        let n = match taken.first() {
                            Some(5) => 2,
                            Some(2) => 4,
                            _ => 0,
                        };
                        i += n.min(taken.len());
                        taken.into_iter().take(n).collect()
                    };
                    let color = match rest.as_slice() {
                        [5, n, ..] => Some(Color::Indexed(*n as u8)),
                        // The colon form may name a colour space first.
                        [2, _, r, g, b] | [2, r, g, b, ..] => {
                            Some(Color::Rgb(*r as u8, *g as u8, *b as u8))
                        }
                        _ => None,
                    };
                    if let Some(color) = color {
                        if code == 38 {
                            self.fg = color;
                        } else {
                            self.bg = color;
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// `ESC[0;...m`: resets, then sets this style.
    fn write_sgr(&self, out: &mut String) {
        out.push_str("\x1b[0");
        for (bit, code) in ATTRIBUTES {
            if self.attributes & bit != 0 {
                let _ = write!(out, ";{code}");
            }
        }
        for (color, base) in [(self.fg, 30), (self.bg, 40)] {
            match color {
                Color::Default => {}
                Color::Indexed(n) if n < 8 => {
                    let _ = write!(out, ";{}", base + u16::from(n));
                }
                Color::Indexed(n) => {
                    let _ = write!(out, ";{};5;{n}", base + 8);
                }
                Color::Rgb(r, g, b) => {
                    let _ = write!(out, ";{};2;{r};{g};{b}", base + 8);
                }
            }
        }
        out.push('m');
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Cell {
    ch: char,
    /// Zero-width characters that follow `ch` (combining marks, joiners).
    extra: Option<Box<str>>,
    style: Style,
}

impl Cell {
    fn blank() -> Self {
        Self {
            ch: ' ',
            extra: None,
            style: Style::default(),
        }
    }
}

#[derive(Debug)]
struct Line {
    cells: Vec<Cell>,
    /// When the program last wrote to this line or had its cursor on it.
    touched: Instant,
    /// Something other than a blank was written here: blank now, the line
    /// was cleared (a bar that went away), not printed empty.
    written: bool,
    /// Text on it was overwritten or erased: a bar, not a line being
    /// printed.
    redrawn: bool,
}

impl Line {
    fn new(now: Instant) -> Self {
        Self {
            cells: Vec::new(),
            touched: now,
            written: false,
            redrawn: false,
        }
    }

    fn is_blank(&self) -> bool {
        self.cells
            .iter()
            .all(|c| c.ch == ' ' && c.extra.is_none() && c.style.bg == Color::Default)
    }

    /// The text, without colours or trailing blanks.
    fn text(&self) -> Vec<u8> {
        let mut text = String::new();
        for cell in &self.cells {
            if cell.ch != WIDE_TAIL {
                text.push(cell.ch);
            }
            if let Some(extra) = &cell.extra {
                text.push_str(extra);
            }
        }
        text.truncate(text.trim_end().len());
        text.into_bytes()
    }

    /// The text as drawn: colours as SGR sequences, reset at the end;
    /// trailing blanks of the default background dropped.
    fn drawn(&self) -> Vec<u8> {
        let end = self
            .cells
            .iter()
            .rposition(|c| c.ch != ' ' || c.style.bg != Color::Default || c.extra.is_some())
            .map_or(0, |i| i + 1);
        let mut out = String::new();
        let mut style = Style::default();
        for cell in &self.cells[..end] {
            if cell.style != style {
                cell.style.write_sgr(&mut out);
                style = cell.style;
            }
            if cell.ch != WIDE_TAIL {
                out.push(cell.ch);
            }
            if let Some(extra) = &cell.extra {
                out.push_str(extra);
            }
        }
        if style != Style::default() {
            out.push_str("\x1b[0m");
        }
        out.into_bytes()
    }
}

/// The parser's target: the lines in reach and the cursor.
#[derive(Debug)]
struct Term {
    /// Never empty: the last line is where output goes next.
    lines: VecDeque<Line>,
    row: usize,
    col: usize,
    style: Style,
    reach: usize,
    /// The cursor is hidden and has not moved up since: lines from this
    /// index on are held.
    hold: Option<usize>,
    saved: Option<(usize, usize, Style)>,
    /// A `\r` came last: text next redraws the line (a bar's frame); a
    /// `\n` next makes it a line end.
    carriage_return: bool,
    now: Instant,
    finished: Vec<Piece>,
}

impl Term {
    fn new(now: Instant) -> Self {
        Self {
            lines: VecDeque::from([Line::new(now)]),
            row: 0,
            col: 0,
            style: Style::default(),
            reach: 0,
            hold: None,
            saved: None,
            carriage_return: false,
            now,
            finished: Vec::new(),
        }
    }

    fn line(&mut self) -> &mut Line {
        let now = self.now;
        let line = &mut self.lines[self.row];
        line.touched = now;
        line
    }

    fn put(&mut self, ch: char) {
        let width = ch.width().unwrap_or(0);
        let col = self.col;
        let style = self.style;
        let after_return = std::mem::take(&mut self.carriage_return);
        let line = self.line();
        if width == 0 {
            // Joins the character before the cursor.
            if let Some(cell) = col.checked_sub(1).and_then(|i| line.cells.get_mut(i)) {
                let mut extra = cell.extra.take().map(String::from).unwrap_or_default();
                extra.push(ch);
                cell.extra = Some(extra.into());
            }
            return;
        }
        line.redrawn |= col < line.cells.len() || after_return;
        if line.cells.len() < col + width {
            line.cells.resize(col + width, Cell::blank());
        }
        // Half of a double-width character overwritten: its other half goes.
        if line.cells[col].ch == WIDE_TAIL && col > 0 {
            line.cells[col - 1] = Cell::blank();
        }
        if let Some(next) = line.cells.get(col + width)
            && next.ch == WIDE_TAIL
        {
            line.cells[col + width] = Cell::blank();
        }
        line.written |= ch != ' ';
        line.cells[col] = Cell {
            ch,
            extra: None,
            style,
        };
        if width == 2 {
            line.cells[col + 1] = Cell {
                ch: WIDE_TAIL,
                extra: None,
                style,
            };
        }
        self.col += width;
        if self.col >= MAX_COLUMNS {
            self.line_feed();
        }
    }

    fn line_feed(&mut self) {
        self.col = 0;
        self.row += 1;
        if self.row == self.lines.len() {
            self.lines.push_back(Line::new(self.now));
        }
        self.lines[self.row].touched = self.now;
        while self.lines.len() > MAX_WINDOW {
            self.finish_first();
        }
    }

    fn up(&mut self, n: usize) {
        self.row = self.row.saturating_sub(n);
        self.reach = self
            .reach
            .max(self.lines.len() - 1 - self.row)
            .min(MAX_WINDOW - 1);
        self.hold = None;
        self.line();
    }

    fn down(&mut self, n: usize) {
        self.row = (self.row + n).min(self.lines.len() - 1);
        self.line();
    }

    fn erase_line(&mut self, mode: u16) {
        let col = self.col;
        let line = self.line();
        line.redrawn |= !line.cells.is_empty();
        match mode {
            0 => line.cells.truncate(col),
            1 => {
                let end = (col + 1).min(line.cells.len());
                line.cells[..end].fill(Cell::blank());
            }
            _ => line.cells.clear(),
        }
    }

    fn erase_display(&mut self, mode: u16) {
        match mode {
            0 => {
                self.erase_line(0);
                self.lines.truncate(self.row + 1);
            }
            1 => {
                for line in self.lines.range_mut(..self.row) {
                    line.cells.clear();
                }
                self.erase_line(1);
            }
            _ => {
                for line in &mut self.lines {
                    line.cells.clear();
                }
            }
        }
    }

    fn finish_first(&mut self) {
        let Some(line) = self.lines.pop_front() else {
            return;
        };
        if !(line.written && line.is_blank()) {
            self.finished.push(Piece::Drawn {
                text: line.text(),
                drawn: line.drawn(),
            });
        }
        self.row = self.row.saturating_sub(1);
        self.hold = self.hold.map(|h| h.saturating_sub(1));
        if let Some((row, _, _)) = &mut self.saved {
            *row = row.saturating_sub(1);
        }
        if self.lines.is_empty() {
            self.lines.push_back(Line::new(self.now));
        }
    }

    /// Index of the first live line.
    fn live_from(&self) -> usize {
        let in_reach = self.lines.len().saturating_sub(self.reach + 1);
        self.hold.map_or(in_reach, |h| h.min(in_reach))
    }

    /// When the first line, out of reach, is finished: a line that was
    /// only printed at once, one that was redrawn after its grace.
    fn due(&self) -> Option<Instant> {
        let first = &self.lines[0];
        (self.live_from() > 0).then(|| {
            if first.redrawn {
                first.touched + GRACE
            } else {
                first.touched
            }
        })
    }

    /// Finishes the lines out of reach that are due.
    fn settle(&mut self) {
        while self.due().is_some_and(|due| self.now >= due) {
            self.finish_first();
        }
    }

    /// The lines in reach, as drawn; for a program that has moved up, also
    /// those waiting out their grace, so that what it draws shows at once.
    /// A program that only prints shows its lines when they are finished,
    /// and its current line only once it redraws it (a `\r` bar): drawing
    /// a line being printed would cost a redraw per write.
    fn live(&self) -> Vec<Vec<u8>> {
        let from = if self.reach > 0 { 0 } else { self.live_from() };
        let drawing = self.reach > 0 || self.hold.is_some();
        let mut live: Vec<Vec<u8>> = self
            .lines
            .range(from..)
            .filter(|line| drawing || line.redrawn)
            .map(Line::drawn)
            .collect();
        while live.last().is_some_and(Vec::is_empty) {
            live.pop();
        }
        let skip = live.len().saturating_sub(MAX_LIVE);
        live.drain(..skip);
        live
    }
}

fn param(params: &vte::Params, index: usize, default: u16) -> u16 {
    match params.iter().nth(index).map(|g| g[0]) {
        None | Some(0) => default,
        Some(n) => n,
    }
}

impl vte::Perform for Term {
    fn print(&mut self, c: char) {
        self.put(c);
    }

    fn execute(&mut self, byte: u8) {
        self.carriage_return = byte == b'\r';
        match byte {
            // Line feed, vertical tab, form feed: a new line, at its start
            // (the pseudo-terminal's ONLCR would add the `\r` anyway).
            b'\n' | 0x0b | 0x0c => self.line_feed(),
            b'\r' => {
                self.col = 0;
                self.line();
            }
            0x08 => self.col = self.col.saturating_sub(1),
            b'\t' => self.col = (self.col / 8 + 1) * 8,
            _ => {}
        }
    }

    fn csi_dispatch(
        &mut self,
        params: &vte::Params,
        intermediates: &[u8],
        _ignore: bool,
        action: char,
    ) {
        if intermediates == b"?" {
            // DECTCEM: a live display starts or ends.
            if params.iter().any(|g| g[0] == 25) {
                match action {
                    'l' => self.hold = Some(self.row),
                    'h' => {
                        self.hold = None;
                        self.reach = 0;
                    }
                    _ => {}
                }
            }
            return;
        }
        if !intermediates.is_empty() {
            return;
        }
        let n = usize::from(param(params, 0, 1));
        match action {
            'A' => self.up(n),
            'B' | 'e' => self.down(n),
            'C' | 'a' => self.col = (self.col + n).min(MAX_COLUMNS - 1),
            'D' => self.col = self.col.saturating_sub(n),
            'E' => {
                self.down(n);
                self.col = 0;
            }
            'F' => {
                self.up(n);
                self.col = 0;
            }
            'G' | '`' => self.col = (n - 1).min(MAX_COLUMNS - 1),
            'H' | 'f' => {
                // Rows count from the first line in reach.
                let row = usize::from(param(params, 0, 1)) - 1;
                let col = usize::from(param(params, 1, 1)) - 1;
                let target = (self.live_from() + row).min(self.lines.len() - 1);
                if target < self.row {
                    self.up(self.row - target);
                } else {
                    self.down(target - self.row);
                }
                self.col = col.min(MAX_COLUMNS - 1);
            }
            'K' => self.erase_line(param(params, 0, 0)),
            'J' => self.erase_display(param(params, 0, 0)),
            'X' => {
                let (col, line) = (self.col, self.line());
                let end = (col + n).min(line.cells.len());
                if col < end {
                    line.cells[col..end].fill(Cell::blank());
                }
            }
            'P' => {
                let (col, line) = (self.col, self.line());
                if col < line.cells.len() {
                    let end = (col + n).min(line.cells.len());
                    line.cells.drain(col..end);
                }
            }
            '@' => {
                let (col, line) = (self.col, self.line());
                if col < line.cells.len() {
                    line.cells
                        .splice(col..col, std::iter::repeat_n(Cell::blank(), n));
                    line.cells.truncate(MAX_COLUMNS);
                }
            }
            'm' => self.style.apply(params),
            's' => self.saved = Some((self.row, self.col, self.style)),
            'u' => self.restore(),
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], _ignore: bool, byte: u8) {
        if !intermediates.is_empty() {
            return;
        }
        match byte {
            b'7' => self.saved = Some((self.row, self.col, self.style)),
            b'8' => self.restore(),
            // Index and next line: down, scrolling at the bottom.
            b'D' => {
                let col = self.col;
                if self.row + 1 == self.lines.len() {
                    self.line_feed();
                } else {
                    self.down(1);
                }
                self.col = col;
            }
            b'E' => self.line_feed(),
            // Reverse index: up one line.
            b'M' => self.up(1),
            _ => {}
        }
    }
}

impl Term {
    fn restore(&mut self) {
        if let Some((row, col, style)) = self.saved {
            if row < self.row {
                self.up(self.row - row);
            } else {
                self.down(row - self.row);
            }
            self.col = col;
            self.style = style;
        }
    }
}

/// One stream of one worker that writes to a pseudo-terminal.
pub struct Screen {
    parser: vte::Parser,
    term: Term,
    /// The live lines last reported.
    shown: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Screen {
    // `vte::Parser` has no `Debug`: its state is mid-sequence bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Screen")
            .field("term", &self.term)
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl Default for Screen {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl Screen {
    pub fn new(now: Instant) -> Self {
        Self {
            parser: vte::Parser::new(),
            term: Term::new(now),
            shown: Vec::new(),
        }
    }

    /// Takes `data` as the program wrote it at `now`: appends to `out` the
    /// lines it finished and, when they changed, the live lines.
    pub fn push(&mut self, data: &[u8], now: Instant, out: &mut Vec<Piece>) {
        self.term.now = now;
        self.parser.advance(&mut self.term, data);
        self.report(out);
    }

    /// Time has passed: finishes what has waited long enough.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<Piece>) {
        self.term.now = now;
        self.report(out);
    }

    /// When [`Self::tick`] next has something to finish, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        self.term.due()
    }

    /// The stream ended: every line is finished (a last empty one, after
    /// the final `\n`, is no line).
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        let term = &mut self.term;
        while term.lines.len() > 1 {
            term.finish_first();
        }
        if !term.lines[0].cells.is_empty() {
            term.finish_first();
        }
        out.append(&mut term.finished);
        if !self.shown.is_empty() {
            self.shown.clear();
            out.push(Piece::Live(Vec::new()));
        }
    }

    fn report(&mut self, out: &mut Vec<Piece>) {
        self.term.settle();
        out.append(&mut self.term.finished);
        let live = self.term.live();
        if live != self.shown {
            self.shown = live.clone();
            out.push(Piece::Live(live));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `writes`, each `gap` after the last, then ends the stream.
    fn run(writes: &[&str], gap: Duration) -> Vec<Piece> {
        let mut now = Instant::now();
        let mut screen = Screen::new(now);
        let mut out = Vec::new();
        for w in writes {
            screen.push(w.as_bytes(), now, &mut out);
            now += gap;
            screen.tick(now, &mut out);
        }
        screen.finish(&mut out);
        out
    }

    fn texts(pieces: &[Piece]) -> Vec<String> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Drawn { text, .. } => Some(String::from_utf8_lossy(text).into_owned()),
                _ => None,
            })
            .collect()
    }

    fn lives(pieces: &[Piece]) -> Vec<Vec<String>> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Live(lines) => Some(
                    lines
                        .iter()
                        .map(|l| String::from_utf8_lossy(l).into_owned())
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn plain_lines_are_finished_in_order_and_the_unterminated_last_too() {
        let out = run(&["one\ntwo\r\n", "", "three"], GRACE);
        assert_eq!(texts(&out), ["one", "two", "three"]);
        let out = run(&["a\n\nb\n"], Duration::ZERO);
        assert_eq!(texts(&out), ["a", "", "b"]);
    }

    #[test]
    fn a_tqdm_bar_is_live_until_its_newline_and_then_one_line() {
        let out = run(
            &["\r  0%|   |", "\r 50%|#  |", "\r100%|###|\n", "done\n"],
            GRACE,
        );
        assert_eq!(texts(&out), ["100%|###|", "done"]);
        assert_eq!(lives(&out), [vec!["  0%|   |"], vec![" 50%|#  |"], vec![]]);
    }

    /// Rich's Live: the cursor is hidden, the region drawn, then redrawn
    /// from its top (`\r`, then erase-line and up per line), log lines
    /// printed above it, and the cursor shown at the end.
    #[test]
    fn a_rich_live_region_is_redrawn_in_place_and_lines_above_it_are_finished() {
        let up2 = "\r\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2K";
        let frame = |n: u32| format!("task a {n}%\ntask b {n}%\ntask c {n}%");
        let writes = [
            "\x1b[?25l".to_owned(),
            frame(0),
            format!("{up2}{}", frame(50)),
            format!("{up2}log line\n{}", frame(60)),
            format!("{up2}{}", frame(100)),
            "\x1b[?25h\n".to_owned(),
            "after\n".to_owned(),
        ];
        let writes: Vec<&str> = writes.iter().map(String::as_str).collect();
        let out = run(&writes, GRACE * 5);
        assert_eq!(
            texts(&out),
            [
                "log line",
                "task a 100%",
                "task b 100%",
                "task c 100%",
                "after"
            ]
        );
        let live = lives(&out);
        assert_eq!(live[0], ["task a 0%", "task b 0%", "task c 0%"]);
        assert_eq!(live[1], ["task a 50%", "task b 50%", "task c 50%"]);
        assert!(live.contains(&vec![
            "task a 60%".into(),
            "task b 60%".into(),
            "task c 60%".into()
        ]));
    }

    /// tqdm's second bar: `\n`, the bar, then `ESC[A` back up, often in
    /// separate writes; the first bar's line is not finished in between.
    #[test]
    fn stacked_bars_written_in_pieces_are_not_finished_early() {
        let mut writes = Vec::new();
        for n in [0, 50, 100] {
            writes.push(format!("\rmain {n}%"));
            writes.push("\n".to_owned());
            writes.push(format!("\rinner {n}%"));
            writes.push("\x1b[A".to_owned());
        }
        writes.push("\n\n".to_owned());
        let writes: Vec<&str> = writes.iter().map(String::as_str).collect();
        let out = run(&writes, GRACE / 10);
        assert_eq!(texts(&out), ["main 100%", "inner 100%"]);
    }

    /// tqdm's `leave=False` bar clears its line with blanks; `print()`
    /// prints an empty one.
    #[test]
    fn a_cleared_line_is_dropped_and_an_empty_one_kept() {
        let out = run(&["\rinner 50%", "\r          \r", "\n", "\n", "x\n"], GRACE);
        assert_eq!(texts(&out), ["", "x"]);
        let out = run(&["bar\x1b[2K\n\n"], GRACE);
        assert_eq!(texts(&out), [""]);
    }

    #[test]
    fn colours_are_kept_when_drawn_and_dropped_from_the_text() {
        let out = run(
            &["\x1b[1;31merror\x1b[0m: \x1b[38;5;208mx\x1b[38:2::1:2:3my\x1b[m\n"],
            GRACE,
        );
        let Some(Piece::Drawn { text, drawn }) =
            out.iter().find(|p| matches!(p, Piece::Drawn { .. }))
        else {
            panic!("{out:?}");
        };
        assert_eq!(text, b"error: xy");
        assert_eq!(
            String::from_utf8_lossy(drawn),
            "\x1b[0;1;31merror\x1b[0m: \x1b[0;38;5;208mx\x1b[0;38;2;1;2;3my\x1b[0m"
        );
    }

    #[test]
    fn wide_characters_take_two_cells_and_combining_marks_none() {
        let out = run(&["日本\x1b[2Dx\n", "e\u{301}!\n"], GRACE);
        // `x` overwrote the first half of 本: its second half is blank.
        assert_eq!(texts(&out), ["日x", "e\u{301}!"]);
    }

    #[test]
    fn erasing_and_moving_within_a_line() {
        let out = run(&["abcdef\x1b[3D\x1b[K!\n", "abc\x1b[1G\x1b[PZ\n"], GRACE);
        assert_eq!(texts(&out), ["abc!", "Zc"]);
    }

    #[test]
    fn a_program_that_never_shows_its_cursor_again_cannot_hold_more_than_the_window() {
        let mut now = Instant::now();
        let mut screen = Screen::new(now);
        let mut out = Vec::new();
        screen.push(b"\x1b[?25l", now, &mut out);
        for i in 0..MAX_WINDOW * 3 {
            now += GRACE;
            screen.push(format!("line {i}\n").as_bytes(), now, &mut out);
        }
        assert_eq!(texts(&out).len(), MAX_WINDOW * 3 + 1 - MAX_WINDOW);
        assert!(lives(&out).iter().all(|l| l.len() <= MAX_LIVE));
    }

    #[test]
    fn a_bar_out_of_reach_waits_for_its_grace_and_a_printed_line_does_not() {
        let start = Instant::now();
        let mut screen = Screen::new(start);
        let mut out = Vec::new();
        screen.push(b"printed\r\n\rbar\n", start, &mut out);
        assert_eq!(texts(&out), ["printed"]);
        assert_eq!(screen.deadline(), Some(start + GRACE));
        screen.tick(start + GRACE / 2, &mut out);
        assert_eq!(texts(&out), ["printed"]);
        screen.tick(start + GRACE, &mut out);
        assert_eq!(texts(&out), ["printed", "bar"]);
        assert_eq!(screen.deadline(), None);
    }
}
