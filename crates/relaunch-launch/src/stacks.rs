//! Python stacks as text, read back: the main thread's frames from a
//! `py-spy dump` or a `faulthandler` dump, and where a rank is stuck, said
//! the way a person would ("in all_reduce, train.py:88"), so that ranks
//! stuck at the same place are told as one group.

use std::collections::BTreeMap;

/// One frame, innermost first in a [`Vec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// The main thread's frames, innermost first, from either dump format;
/// empty when the text is neither.
///
/// `py-spy dump` names the threads (`Thread 12 (idle): "MainThread"`) and
/// writes frames as `    function (path/file.py:88)`. `faulthandler`
/// writes `Thread 0x... (most recent call first):` (or `Current thread`)
/// blocks of `  File "path", line 88 in function`, newest thread first, so
/// the main thread (the first one started) is its last block.
pub fn main_thread(dump: &str) -> Vec<Frame> {
    let mut threads: Vec<(bool, Vec<Frame>)> = Vec::new();
    let mut py_spy = false;
    for line in dump.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("Thread ") || trimmed.starts_with("Current thread ") {
            let named_main = trimmed.ends_with("\"MainThread\"");
            py_spy |= trimmed.contains('"');
            threads.push((named_main, Vec::new()));
            continue;
        }
        let Some((_, frames)) = threads.last_mut() else {
            continue;
        };
        if let Some(frame) = faulthandler_frame(trimmed).or_else(|| py_spy_frame(trimmed)) {
            frames.push(frame);
        }
    }
    let main = if py_spy {
        threads.iter().find(|(main, _)| *main)
    } else {
        threads.last()
    };
    main.or(threads.first())
        .map(|(_, frames)| frames.clone())
        .unwrap_or_default()
}

/// `File "/x/train.py", line 88 in train`
fn faulthandler_frame(line: &str) -> Option<Frame> {
    let rest = line.strip_prefix("File \"")?;
    let (file, rest) = rest.split_once("\", line ")?;
    let (number, function) = rest.split_once(" in ")?;
    Some(Frame {
        function: function.trim().to_owned(),
        file: file.to_owned(),
        line: number.trim().parse().ok()?,
    })
}

/// `train (train.py:88)`, `all_reduce (torch/distributed/c10d.py:2050)`
fn py_spy_frame(line: &str) -> Option<Frame> {
    let (function, rest) = line.split_once(" (")?;
    let inner = rest.strip_suffix(')')?;
    let (file, number) = inner.rsplit_once(':')?;
    Some(Frame {
        function: function.trim().to_owned(),
        file: file.to_owned(),
        line: number.parse().ok()?,
    })
}

/// Whether `file` is the user's code rather than Python's or an installed
/// package's.
fn is_user_code(file: &str) -> bool {
    !(file.contains("site-packages/")
        || file.contains("dist-packages/")
        || file.starts_with('<')
        || file.contains("/lib/python3"))
}

/// Where the frames say a rank is: the innermost function, and the
/// innermost line of the user's own code when that is another frame.
/// `None` without frames.
pub fn place(frames: &[Frame]) -> Option<String> {
    let top = frames.first()?;
    let short = |f: &Frame| {
        let name = f.file.rsplit('/').next().unwrap_or(&f.file);
        format!("{name}:{}", f.line)
    };
    Some(match frames.iter().find(|f| is_user_code(&f.file)) {
        Some(user) if !std::ptr::eq(top, user) => {
            format!(
                "in {}, {} (from {})",
                top.function,
                short(user),
                user.function
            )
        }
        _ => format!("in {}, {}", top.function, short(top)),
    })
}

/// Where torch waits for the other ranks: its collectives and process
/// groups, DDP's own calls, and the autograd engine (DDP's backward waits
/// there for the others' gradients).
const PEER_WAITS: [&str; 3] = [
    "torch/distributed/",
    "torch/autograd/",
    "torch/nn/parallel/distributed.py",
];

/// Whether the rank whose main thread is at `frames` waits for its peers:
/// its innermost frame is in torch's collective, DDP or autograd code.
/// `None` without frames. A rank stuck elsewhere (in the user's code, in
/// data loading) is what the others may be waiting for.
pub fn waits_on_peers(frames: &[Frame]) -> Option<bool> {
    let top = frames.first()?;
    Some(PEER_WAITS.iter().any(|p| top.file.contains(p)))
}

/// Ranks grouped by place, the largest group first: `("0-2,5", "in
/// all_reduce, train.py:88")`.
pub fn group(places: &[(usize, String)]) -> Vec<(String, String)> {
    let mut by_place: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (rank, place) in places {
        by_place.entry(place).or_default().push(*rank);
    }
    let mut groups: Vec<(Vec<usize>, &str)> = by_place
        .into_iter()
        .map(|(place, mut ranks)| {
            ranks.sort_unstable();
            (ranks, place)
        })
        .collect();
    groups.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    groups
        .into_iter()
        .map(|(ranks, place)| (ranks_text(&ranks), place.to_owned()))
        .collect()
}

/// `[0, 1, 2, 5]` as `0-2,5`.
pub fn ranks_text(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAULTHANDLER: &str = "\
Thread 0x00007f1c2a5fe640 (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 324 in wait
  File \"/venv/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py\", line 55 in _pin_memory_loop

Current thread 0x00007f1c3b1b3740 (most recent call first):
  File \"/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py\", line 2050 in all_reduce
  File \"/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py\", line 83 in wrapper
  File \"/home/u/train.py\", line 88 in step
  File \"/home/u/train.py\", line 120 in <module>
";

    const PY_SPY: &str = "\
Process 4242: python -u train.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 4242 (idle): \"MainThread\"
    __next__ (torch/utils/data/dataloader.py:631)
    train (train.py:61)
    <module> (train.py:120)
Thread 4250 (idle): \"Thread-1\"
    wait (threading.py:324)
";

    #[test]
    fn the_main_thread_is_found_in_either_format() {
        let frames = main_thread(FAULTHANDLER);
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[0].function, "all_reduce");
        assert_eq!(
            place(&frames).unwrap(),
            "in all_reduce, train.py:88 (from step)"
        );
        let frames = main_thread(PY_SPY);
        assert_eq!(frames[0].function, "__next__");
        // py-spy shortens paths: a relative torch path is not the user's,
        // but nothing tells; the innermost frame is what a person reads.
        assert_eq!(frames[1].line, 61);
        assert!(main_thread("no stack here\n").is_empty());
        assert_eq!(place(&[]), None);
    }

    #[test]
    fn ranks_stuck_at_one_place_are_one_group() {
        let places = vec![
            (0, "in all_reduce, train.py:88".to_owned()),
            (7, "in __next__, train.py:61".to_owned()),
            (1, "in all_reduce, train.py:88".to_owned()),
            (2, "in all_reduce, train.py:88".to_owned()),
            (5, "in all_reduce, train.py:88".to_owned()),
        ];
        assert_eq!(
            group(&places),
            [
                ("0-2,5".to_owned(), "in all_reduce, train.py:88".to_owned()),
                ("7".to_owned(), "in __next__, train.py:61".to_owned()),
            ]
        );
        assert_eq!(ranks_text(&[3]), "3");
        assert_eq!(ranks_text(&[0, 1, 3, 4, 5, 9]), "0-1,3-5,9");
    }
}
