//! Where a zip entry starts a chunk: the part of the chunker
//! ([`crate::files::Chunks`]) that reads zip local file headers.
//!
//! A `torch.save` file is a zip of stored entries, one per tensor storage.
//! A large entry (at least [`LARGE_ENTRY`] bytes of data) gets chunks of
//! its own, and its header gets one apart from its data: the header names
//! the entry after the archive's top directory, which `torch.save` names
//! after the file (`epoch=3-step=500/data/7` in `epoch=3-step=500.ckpt`),
//! so a checkpoint saved under a new name changes every header and no
//! data chunk. The data's chunks are FastCDC's from the data's first byte,
//! and its last one ends with the data (and the data descriptor after it,
//! which holds only the CRC and sizes), whatever follows. Small entries
//! (an Adam `step` scalar, a bias) are grouped, headers and all: a chunk
//! ends before a small entry's header only once it holds [`ENTRY_GROUP`]
//! bytes, so thousands of scalars make a few chunks, and a changed scalar
//! costs its group (less than [`ENTRY_GROUP`] plus one small entry), never
//! a large neighbour's megabytes.
//!
//! An entry's size comes from its local header, from the zip64 extra field
//! when the header's sizes are `0xFFFFFFFF`, or, when general-purpose flag
//! bit 3 is set (PyTorch's writer sets it and leaves the sizes at zero),
//! from the data descriptor (`PK\x07\x08`, then the CRC and sizes) that
//! follows the data: an entry is small when such a descriptor, naming the
//! data's exact length, turns up within [`LARGE_ENTRY`] bytes, and a large
//! one's data ends at the first descriptor that names exactly the bytes
//! since the data began ([`DataEnd::Described`]). A header with no usable
//! size (cut off by the end of the file, a malformed zip64 field) cuts as
//! before these rules: at least
//! [`ENTRY_CUT_MIN`](crate::chunk_limits::ENTRY_CUT_MIN) bytes in. Inside a large
//! entry's data no signature counts.
//!
//! Everything here reads only the bytes it is given, at most [`LOOKAHEAD`]
//! past a header, so the cuts are a function of the file's bytes alone.

use crate::chunk_limits::{ENTRY_CUT_MIN, ZIP_ENTRY};

/// An entry with at least this many bytes of data starts a chunk of its
/// own.
pub const LARGE_ENTRY: usize = 32 * 1024;
/// A chunk ends before a small entry's header at least this far into it.
pub const ENTRY_GROUP: usize = 32 * 1024;

/// A local file header's fixed part.
const HEADER_LEN: usize = 30;
/// General-purpose flag bit 3: sizes follow the data, in a descriptor.
const FLAG_DESCRIPTOR: u16 = 1 << 3;
const DESCRIPTOR: &[u8; 4] = b"PK\x07\x08";
/// A zip64 descriptor: signature, CRC, two 8-byte sizes.
const DESCRIPTOR64_LEN: usize = 24;
/// The zip64 extended information extra field.
const ZIP64_EXTRA: u16 = 1;

/// How many bytes from a header's start [`entry_at`] may read: the fixed
/// header, the longest name and extra field, a small entry's data and its
/// descriptor. The chunker keeps this much past its largest chunk in view.
pub const LOOKAHEAD: usize = HEADER_LEN + 2 * u16::MAX as usize + LARGE_ENTRY + DESCRIPTOR64_LEN;

/// What a local file header says about its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// At least [`LARGE_ENTRY`] bytes of data, starting `data` bytes after
    /// the header's first; `size`: how many, when the header says.
    Large {
        data: usize,
        size: Option<u64>,
    },
    Small,
    /// No usable size.
    Unknown,
}

/// Where the data of the large entry that the chunker is inside ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataEnd {
    /// At this offset of the file (the header gave the size).
    At(u64),
    /// Right after the data descriptor that names, as both sizes, the
    /// bytes from this offset of the file (where the data began) to the
    /// descriptor.
    Described(u64),
}

/// A data descriptor's length, with 4- and 8-byte sizes.
const DESCRIPTOR32_LEN: usize = 16;

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The entry whose local header starts `bytes` (which hold the rest of the
/// file, or at least [`LOOKAHEAD`] bytes).
fn entry_at(bytes: &[u8]) -> Entry {
    let bytes = &bytes[..bytes.len().min(LOOKAHEAD)];
    let (Some(flags), Some(size), Some(name_len), Some(extra_len)) = (
        u16_at(bytes, 6),
        u32_at(bytes, 18),
        u16_at(bytes, 26),
        u16_at(bytes, 28),
    ) else {
        return Entry::Unknown;
    };
    let extra = HEADER_LEN + name_len as usize;
    let data = extra + extra_len as usize;
    if bytes.len() < data {
        return Entry::Unknown;
    }
    if flags & FLAG_DESCRIPTOR != 0 {
        return described(bytes, data);
    }
    let size = match (size, u32_at(bytes, 22)) {
        (u32::MAX, _) | (_, Some(u32::MAX)) => match zip64_size(&bytes[extra..data]) {
            Some(size) => size,
            None => return Entry::Unknown,
        },
        (size, _) => u64::from(size),
    };
    if size >= LARGE_ENTRY as u64 {
        Entry::Large {
            data,
            size: Some(size),
        }
    } else {
        Entry::Small
    }
}

/// An entry whose sizes follow its data (flag bit 3), the data starting at
/// `data`: small if a descriptor naming exactly the bytes before it turns
/// up within [`LARGE_ENTRY`] bytes.
fn described(bytes: &[u8], data: usize) -> Entry {
    let end = bytes.len().min(data + LARGE_ENTRY + DESCRIPTOR.len() - 1);
    for at in memchr::memmem::find_iter(&bytes[data..end], DESCRIPTOR) {
        let length = at as u64;
        let sizes = data + at + 8;
        if u32_at(bytes, sizes).map(u64::from) == Some(length)
            || u64_at(bytes, sizes) == Some(length)
        {
            return Entry::Small;
        }
    }
    // Every place a small entry's descriptor could be was in view.
    if bytes.len() >= data + LARGE_ENTRY + DESCRIPTOR64_LEN {
        Entry::Large { data, size: None }
    } else {
        Entry::Unknown
    }
}

/// Where the descriptor that ends a large entry's data (begun at `start`
/// in the file) starts and ends in `block` (at `offset` in the file), if
/// it starts at or before `cdc`: a `PK\x07\x08` whose two sizes, 4 or 8
/// bytes each, both name the bytes from `start` to it.
fn descriptor_at(block: &[u8], offset: u64, start: u64, cdc: usize) -> Option<(usize, usize)> {
    let end = block.len().min(cdc + DESCRIPTOR.len());
    for at in memchr::memmem::find_iter(&block[..end], DESCRIPTOR) {
        let length = (offset + at as u64).checked_sub(start)?;
        let sized32 = |i| u32_at(block, at + i).map(u64::from) == Some(length);
        let sized64 = |i| u64_at(block, at + i) == Some(length);
        if sized32(8) && sized32(12) {
            return Some((at, at + DESCRIPTOR32_LEN));
        }
        if sized64(8) && sized64(16) {
            return Some((at, at + DESCRIPTOR64_LEN));
        }
    }
    None
}

/// The chunk at the start of `block` (at `offset` in the file) and where
/// the chunker is after it, given FastCDC's cut `cdc` (at most the block's
/// length, at most [`CHUNK_MAX`](crate::chunk_limits::CHUNK_MAX)) and `inside`,
/// the large entry whose data the block starts in (from the call before):
/// - inside a large entry's data: its end if that comes by `cdc`, else
///   `cdc`, and no signature counts;
/// - at the header of a large entry: the header alone;
/// - else [`entry_cut`].
///
/// `block` must hold [`LOOKAHEAD`] bytes past `cdc`, or the rest of the
/// file.
pub fn cut(
    block: &[u8],
    offset: u64,
    cdc: usize,
    inside: Option<DataEnd>,
) -> (usize, Option<DataEnd>) {
    match inside {
        Some(DataEnd::At(end)) if end > offset => {
            let left = usize::try_from(end - offset).unwrap_or(usize::MAX);
            return if left <= cdc {
                (left, None)
            } else {
                (cdc, inside)
            };
        }
        Some(DataEnd::Described(start)) => {
            return match descriptor_at(block, offset, start, cdc) {
                // A descriptor across the largest chunk's end: the chunk ends
                // before it, and the next one starts with it.
                Some((at, after)) if after > crate::chunk_limits::CHUNK_MAX => (at, inside),
                Some((_, after)) => (after, None),
                None => (cdc, inside),
            };
        }
        _ => {}
    }
    if block.starts_with(ZIP_ENTRY)
        && let Entry::Large { data, size } = entry_at(block)
    {
        let next = match size {
            Some(size) => DataEnd::At(offset + data as u64 + size),
            None => DataEnd::Described(offset + data as u64),
        };
        return (data, Some(next));
    }
    (entry_cut(block, cdc), None)
}

/// The compressed size in a zip64 extended information field, among the
/// extra fields `extra`.
fn zip64_size(mut extra: &[u8]) -> Option<u64> {
    while extra.len() >= 4 {
        let (id, len) = (u16_at(extra, 0)?, u16_at(extra, 2)? as usize);
        let field = extra.get(4..4 + len)?;
        if id == ZIP64_EXTRA {
            // The local header's zip64 field holds both sizes: original,
            // then compressed.
            return u64_at(field, 8);
        }
        extra = &extra[4 + len..];
    }
    None
}

/// Where the chunk at the start of `block` ends, given FastCDC's cut `cdc`
/// (at most the block's length), outside a large entry's data: before the
/// first zip entry header after the block's first byte that starts before
/// `cdc` and either begins a large entry (at least one byte in), a small
/// one at least [`ENTRY_GROUP`] bytes in, or one of unknown size at least
/// [`ENTRY_CUT_MIN`] bytes in; else `cdc`. `block` must hold
/// [`LOOKAHEAD`] bytes past `cdc`, or the rest of the file.
pub fn entry_cut(block: &[u8], cdc: usize) -> usize {
    let search_end = block.len().min(cdc + ZIP_ENTRY.len() - 1);
    let Some(span) = block.get(1..search_end) else {
        return cdc;
    };
    for at in memchr::memmem::find_iter(span, ZIP_ENTRY) {
        let header = 1 + at;
        let cuts = match entry_at(&block[header..]) {
            Entry::Large { .. } => true,
            Entry::Small => header >= ENTRY_GROUP,
            Entry::Unknown => header >= ENTRY_CUT_MIN,
        };
        if cuts {
            return header;
        }
    }
    cdc
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::files::{CHUNK_MAX, Chunks, Piece};

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        crate::files::tests::noise(len, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// How a test zip's headers give their sizes.
    #[derive(Clone, Copy)]
    enum Style {
        /// As PyTorch writes: flag bit 3, sizes zero, a descriptor after the
        /// data; data aligned to 64 bytes with an extra field.
        Torch,
        /// Sizes in the local header.
        Sized,
        /// Sizes `0xFFFFFFFF` in the header, the real ones in a zip64 field.
        Zip64,
    }

    /// A zip-like file of stored entries holding `entries`' bytes, and
    /// where each entry's header starts, then where the central directory
    /// does.
    fn zip(entries: &[Vec<u8>], style: Style) -> (Vec<u8>, Vec<usize>) {
        zip_named(entries, style, "archive")
    }

    /// [`zip`] with the archive's top directory named `top` (`torch.save`
    /// names it after the file).
    fn zip_named(entries: &[Vec<u8>], style: Style, top: &str) -> (Vec<u8>, Vec<usize>) {
        let mut file = Vec::new();
        let mut starts = Vec::new();
        for (i, data) in entries.iter().enumerate() {
            starts.push(file.len());
            let name = format!("{top}/data/{i}");
            let mut extra = Vec::new();
            if let Style::Zip64 = style {
                extra.extend_from_slice(&ZIP64_EXTRA.to_le_bytes());
                extra.extend_from_slice(&16u16.to_le_bytes());
                extra.extend_from_slice(&(data.len() as u64).to_le_bytes());
                extra.extend_from_slice(&(data.len() as u64).to_le_bytes());
            }
            if let Style::Torch = style {
                // PyTorch pads with an extra field so the data starts on a
                // 64-byte boundary.
                let unpadded = file.len() + HEADER_LEN + name.len() + 4;
                let pad = (64 - unpadded % 64) % 64;
                extra.extend_from_slice(&0x4654u16.to_le_bytes());
                extra.extend_from_slice(&(pad as u16).to_le_bytes());
                extra.resize(4 + pad, b'Z');
            }
            let (flags, size) = match style {
                Style::Torch => (0x0808u16, 0u32),
                Style::Sized => (0, data.len() as u32),
                Style::Zip64 => (0, u32::MAX),
            };
            file.extend_from_slice(ZIP_ENTRY);
            file.extend_from_slice(&[45, 0]);
            file.extend_from_slice(&flags.to_le_bytes());
            file.extend_from_slice(&[0; 10]); // method, time, date, crc
            file.extend_from_slice(&size.to_le_bytes());
            file.extend_from_slice(&size.to_le_bytes());
            file.extend_from_slice(&(name.len() as u16).to_le_bytes());
            file.extend_from_slice(&(extra.len() as u16).to_le_bytes());
            file.extend_from_slice(name.as_bytes());
            file.extend_from_slice(&extra);
            file.extend_from_slice(data);
            if let Style::Torch = style {
                file.extend_from_slice(DESCRIPTOR);
                file.extend_from_slice(&[0; 4]);
                file.extend_from_slice(&(data.len() as u32).to_le_bytes());
                file.extend_from_slice(&(data.len() as u32).to_le_bytes());
            }
        }
        // The central directory, as far as the chunker cares.
        starts.push(file.len());
        file.extend_from_slice(b"PK\x01\x02");
        file.extend_from_slice(&noise(46 * entries.len(), 99));
        (file, starts)
    }

    pub(crate) fn pieces(data: &[u8]) -> Vec<Piece> {
        let cut: Vec<Piece> = Chunks::new(data).collect::<Result<_, _>>().unwrap();
        // The same bytes cut the same way, however the reader hands them
        // out, and the chunks cover them.
        let trickle = std::io::BufReader::with_capacity(777, data);
        let again: Vec<Piece> = Chunks::new(trickle).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            cut.iter().map(|p| p.offset).collect::<Vec<_>>(),
            again.iter().map(|p| p.offset).collect::<Vec<_>>()
        );
        let mut offset = 0;
        for piece in &cut {
            assert_eq!(piece.offset, offset);
            assert!(!piece.data.is_empty() && piece.data.len() <= CHUNK_MAX);
            assert_eq!(
                &data[offset as usize..][..piece.data.len()],
                &piece.data[..]
            );
            offset += piece.data.len() as u64;
        }
        assert_eq!(offset, data.len() as u64);
        cut
    }

    pub(crate) fn sent(old: &[Piece], new: &[Piece]) -> usize {
        let have: HashSet<_> = old.iter().map(|p| &p.data).collect();
        new.iter()
            .filter(|p| !have.contains(&p.data))
            .map(|p| p.data.len())
            .sum()
    }

    /// An Adam-like state: large tensors each after a scalar `step` (8
    /// bytes), then a run of 2000 small ones (scalars and 4 KiB biases).
    fn adam_like(changed: &[usize], step: u64) -> Vec<Vec<u8>> {
        let mut entries = Vec::new();
        for i in 0..6u64 {
            entries.push(step.to_le_bytes().to_vec());
            let size = [3 << 20, 300 << 10, 40 << 10, 1 << 20, 5 << 20, 64 << 10][i as usize];
            let seed = if changed.contains(&entries.len()) {
                1000 + i
            } else {
                i
            };
            entries.push(noise(size, seed));
        }
        for i in 0..2000u64 {
            let size = if i % 10 == 0 { 4096 } else { 8 };
            let seed = if changed.contains(&entries.len()) {
                5000 + i
            } else {
                100 + i
            };
            entries.push(noise(size, seed));
        }
        entries
    }

    #[test]
    fn large_entries_start_chunks_and_small_ones_are_grouped() {
        for style in [Style::Torch, Style::Sized, Style::Zip64] {
            let entries = adam_like(&[], 1);
            let (file, starts) = zip(&entries, style);
            let cut = pieces(&file);
            let cuts: Vec<usize> = cut.iter().map(|p| p.offset as usize).collect();
            for (i, data) in entries.iter().enumerate() {
                if data.len() >= LARGE_ENTRY {
                    assert!(cuts.contains(&starts[i]), "large entry {i}");
                    // Its interior cuts are FastCDC's from its header on.
                    let end = starts[i + 1];
                    let alone: Vec<usize> = pieces(&file[starts[i]..end])
                        .iter()
                        .map(|p| starts[i] + p.offset as usize)
                        .collect();
                    let inside: Vec<usize> = cuts
                        .iter()
                        .copied()
                        .filter(|c| (starts[i]..end).contains(c))
                        .collect();
                    assert_eq!(inside, alone, "entry {i}");
                }
            }
            // A chunk that holds a small entry's start is small (but for
            // the last, which holds the central directory too).
            for piece in &cut[..cut.len() - 1] {
                let span = piece.offset as usize..piece.offset as usize + piece.data.len();
                if starts
                    .iter()
                    .zip(&entries)
                    .any(|(s, d)| d.len() < LARGE_ENTRY && span.contains(s))
                {
                    assert!(piece.data.len() < 2 * ENTRY_GROUP, "{span:?}");
                }
            }
            // The 2000 small entries make a chunk per ENTRY_GROUP bytes, not
            // thousands.
            let run = starts[12]..starts[entries.len()];
            let in_run = cuts.iter().filter(|c| run.contains(c)).count();
            assert!(in_run <= run.len() / ENTRY_GROUP + 1, "{in_run} chunks");
        }
    }

    #[test]
    fn a_changed_small_entry_costs_its_group_not_its_neighbour() {
        for style in [Style::Torch, Style::Sized, Style::Zip64] {
            let (first, _) = zip(&adam_like(&[], 1), style);
            let old = pieces(&first);
            // Every `step` scalar changes, nothing else.
            let (second, _) = zip(&adam_like(&[], 2), style);
            let new = pieces(&second);
            assert!(
                sent(&old, &new) <= 6 * 2 * ENTRY_GROUP,
                "{}",
                sent(&old, &new)
            );
            // Two large tensors (3 MiB, 1 MiB) and two small ones change too.
            let (third, _) = zip(&adam_like(&[1, 7, 20, 1500], 2), style);
            let extra = sent(&new, &pieces(&third));
            assert!(extra >= 4 << 20);
            assert!(extra <= (4 << 20) + 3 * 2 * ENTRY_GROUP, "{extra}");
        }
    }

    #[test]
    fn a_new_file_name_costs_the_headers_and_small_groups_not_the_tensors() {
        for style in [Style::Torch, Style::Sized, Style::Zip64] {
            let entries = adam_like(&[], 1);
            let (first, _) = zip_named(&entries, style, "ckpt-1");
            let old = pieces(&first);
            // The same state, saved as `epoch=0-step=200.ckpt`: the large
            // tensors' data chunks are all there already.
            let (second, starts) = zip_named(&entries, style, "epoch=0-step=200");
            let small: usize = entries
                .iter()
                .filter(|d| d.len() < LARGE_ENTRY)
                .map(|d| d.len() + 200)
                .sum();
            let headers = 6 * 200;
            let central = second.len() - starts[entries.len()];
            let renamed = sent(&old, &pieces(&second));
            assert!(
                renamed <= small + headers + central + 2 * ENTRY_GROUP,
                "{renamed} bytes"
            );
            // And a renamed file whose two large tensors changed sends them
            // and about as much again as the rename alone.
            let (third, _) = zip_named(&adam_like(&[1, 7], 1), style, "epoch=0-step=300");
            let both = sent(&old, &pieces(&third));
            assert!(
                both >= 4 << 20 && both <= (4 << 20) + renamed + 2 * ENTRY_GROUP,
                "{both}"
            );
        }
    }

    #[test]
    fn a_signature_inside_tensor_data_does_not_cut_its_first_chunk() {
        let mut tensor = noise(1 << 20, 3);
        for at in (0..tensor.len() - 64).step_by(4099) {
            tensor[at..at + 4].copy_from_slice(ZIP_ENTRY);
        }
        let (file, starts) = zip(&[vec![1; 8], tensor, vec![2; 8]], Style::Torch);
        let cut = pieces(&file);
        // The header alone, then the data's chunks, FastCDC's from its
        // first byte: none at a signature (none shorter than CHUNK_MIN but
        // the last, which ends with the data's descriptor).
        assert_eq!(cut[1].offset as usize, starts[1]);
        let data = cut[2].offset as usize;
        assert!(
            data - starts[1] < 200,
            "a header of {} bytes",
            data - starts[1]
        );
        let end = starts[2];
        let inside: Vec<&Piece> = cut
            .iter()
            .filter(|p| (data..end).contains(&(p.offset as usize)))
            .collect();
        assert_eq!(
            inside.last().map(|p| p.offset as usize + p.data.len()),
            Some(end)
        );
        for piece in &inside[..inside.len() - 1] {
            assert!(
                piece.data.len() >= crate::files::CHUNK_MIN,
                "{}",
                piece.offset
            );
        }
    }

    fn clone_with(file: &[u8], change: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut copy = file.to_vec();
        change(&mut copy);
        copy
    }

    #[test]
    fn adversarial_headers_neither_panic_nor_make_tiny_chunks() {
        // Signatures every 40 bytes with random header fields.
        let mut file = noise(4 << 20, 11);
        for at in (0..file.len() - 4).step_by(40) {
            file[at..at + 4].copy_from_slice(ZIP_ENTRY);
        }
        let cut = pieces(&file);
        assert!(
            cut.len() <= 2 * file.len() / LARGE_ENTRY + 2,
            "{} chunks",
            cut.len()
        );
        // Absurd sizes: the largest name and extra lengths, a 4 GiB entry,
        // a zip64 sentinel with no zip64 field, and a header cut off by
        // the end of the file.
        let mut file = noise(1 << 20, 12);
        let clean = file.clone();
        let mut absurd = |at: usize, flags: u16, size: u32, name: u16, extra: u16| {
            file[at..at + 4].copy_from_slice(ZIP_ENTRY);
            file[at + 6..at + 8].copy_from_slice(&flags.to_le_bytes());
            file[at + 18..at + 22].copy_from_slice(&size.to_le_bytes());
            file[at + 22..at + 26].copy_from_slice(&size.to_le_bytes());
            file[at + 26..at + 28].copy_from_slice(&name.to_le_bytes());
            file[at + 28..at + 30].copy_from_slice(&extra.to_le_bytes());
        };
        absurd(600_000, 0, u32::MAX, 0, 0);
        absurd((1 << 20) - 200, 8, 0, 10, 0);
        file.extend_from_slice(&ZIP_ENTRY[..]);
        file.extend_from_slice(&[20, 0, 8]);
        let cut = pieces(&file);
        let cuts: Vec<usize> = cut.iter().map(|p| p.offset as usize).collect();
        // The malformed zip64 one falls back to the old rule (512 bytes
        // in), which it meets; the rest are too short to be large.
        assert!(cuts.contains(&600_000), "{cuts:?}");
        // Sizes after the data, the longest name and extra field, and no
        // descriptor ever: the header, then data to the end.
        file = clone_with(&clean, |f| {
            f[300_000..300_004].copy_from_slice(ZIP_ENTRY);
            f[300_006..300_008].copy_from_slice(&8u16.to_le_bytes());
            f[300_026..300_030].copy_from_slice(&[0xff; 4]);
            f[600_000..600_004].copy_from_slice(ZIP_ENTRY);
        });
        let cuts: Vec<usize> = pieces(&file).iter().map(|p| p.offset as usize).collect();
        let at = cuts
            .iter()
            .position(|&c| c == 300_000)
            .expect("the header cuts");
        assert_eq!(cuts[at + 1], 300_000 + HEADER_LEN + 2 * u16::MAX as usize);
        assert!(!cuts.contains(&600_000), "{cuts:?}");
        // A 4 GiB claim with the longest name and extra field: its header
        // is a chunk, and everything after it is its data.
        file = clone_with(&clean, |f| {
            f[1000..1004].copy_from_slice(ZIP_ENTRY);
            f[1018..1022].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
            f[1022..1026].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
            f[1026..1030].copy_from_slice(&[0xff; 4]);
            f[600_000..600_004].copy_from_slice(ZIP_ENTRY);
        });
        let cuts: Vec<usize> = pieces(&file).iter().map(|p| p.offset as usize).collect();
        assert_eq!(
            cuts[..3],
            [0, 1000, 1000 + HEADER_LEN + 2 * u16::MAX as usize]
        );
        assert!(!cuts.contains(&600_000), "{cuts:?}");
        for len in [0, 3, 4, 29, 30, 100] {
            let mut tail = noise(len, 5);
            if len >= 4 {
                tail[..4].copy_from_slice(ZIP_ENTRY);
            }
            pieces(&tail);
            assert_eq!(entry_cut(&tail, tail.len().max(1)), tail.len().max(1));
        }
    }
}
