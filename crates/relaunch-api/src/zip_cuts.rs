//! Where a zip entry starts a chunk: the part of the chunker
//! ([`crate::files::Chunks`]) that reads zip local file headers.
//!
//! A `torch.save` file is a zip of stored entries, one per tensor storage.
//! A large entry (at least [`LARGE_ENTRY`] bytes of data) always starts a
//! chunk, so its chunks are its own whatever surrounds it. Small entries
//! (an Adam `step` scalar, a bias) are grouped: a chunk ends before a small
//! entry's header only once it holds [`ENTRY_GROUP`] bytes, so thousands of
//! scalars make a few chunks, and a changed scalar costs its group (less
//! than [`ENTRY_GROUP`] plus one small entry), never a large neighbour's
//! megabytes.
//!
//! An entry's size comes from its local header, from the zip64 extra field
//! when the header's sizes are `0xFFFFFFFF`, or, when general-purpose flag
//! bit 3 is set (PyTorch's writer sets it and leaves the sizes at zero),
//! from the data descriptor (`PK\x07\x08`, then the CRC and sizes) that
//! follows the data: an entry is small when such a descriptor, naming the
//! data's exact length, turns up within [`LARGE_ENTRY`] bytes. A header
//! with no usable size (cut off by the end of the file, a malformed zip64
//! field) cuts as before this rule: at least
//! [`ENTRY_CUT_MIN`](crate::files::ENTRY_CUT_MIN) bytes in.
//!
//! Everything here reads only the bytes it is given, at most [`LOOKAHEAD`]
//! past a header, so the cuts are a function of the file's bytes alone.

use crate::files::{ENTRY_CUT_MIN, ZIP_ENTRY};

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
    /// At least [`LARGE_ENTRY`] bytes of data; the first `inside` bytes
    /// from the header on are the entry's own (a signature there is data).
    Large {
        inside: usize,
    },
    Small,
    /// No usable size.
    Unknown,
}

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
        let inside = usize::try_from(size).unwrap_or(usize::MAX);
        Entry::Large {
            inside: data.saturating_add(inside),
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
        Entry::Large {
            inside: data + LARGE_ENTRY,
        }
    } else {
        Entry::Unknown
    }
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
/// (at most the block's length): before the first zip entry header that
/// starts before `cdc` and either begins a large entry (at least one byte
/// in), a small one at least [`ENTRY_GROUP`] bytes in, or one of unknown
/// size at least [`ENTRY_CUT_MIN`] bytes in; else `cdc`. A header inside
/// the data of a large entry that starts the block does not count.
/// `block` must hold [`LOOKAHEAD`] bytes past `cdc`, or the rest of the
/// file.
pub fn entry_cut(block: &[u8], cdc: usize) -> usize {
    let from = match block.starts_with(ZIP_ENTRY).then(|| entry_at(block)) {
        Some(Entry::Large { inside }) => inside,
        _ => 1,
    };
    let search_end = block.len().min(cdc + ZIP_ENTRY.len() - 1);
    let Some(span) = block.get(from..search_end) else {
        return cdc;
    };
    for at in memchr::memmem::find_iter(span, ZIP_ENTRY) {
        let header = from + at;
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
mod tests {
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
        let mut file = Vec::new();
        let mut starts = Vec::new();
        for (i, data) in entries.iter().enumerate() {
            starts.push(file.len());
            let name = format!("archive/data/{i}");
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

    fn pieces(data: &[u8]) -> Vec<Piece> {
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

    fn sent(old: &[Piece], new: &[Piece]) -> usize {
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
    fn a_signature_inside_tensor_data_does_not_cut_its_first_chunk() {
        let mut tensor = noise(1 << 20, 3);
        for at in (0..tensor.len() - 64).step_by(4099) {
            tensor[at..at + 4].copy_from_slice(ZIP_ENTRY);
        }
        let (file, starts) = zip(&[vec![1; 8], tensor, vec![2; 8]], Style::Torch);
        let cut = pieces(&file);
        assert_eq!(cut[1].offset as usize, starts[1]);
        // The first chunk of the tensor reaches past its first 32 KiB.
        assert!(cut[2].offset as usize >= starts[1] + LARGE_ENTRY);
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
        let mut absurd = |at: usize, flags: u16, size: u32, name: u16, extra: u16| {
            file[at..at + 4].copy_from_slice(ZIP_ENTRY);
            file[at + 6..at + 8].copy_from_slice(&flags.to_le_bytes());
            file[at + 18..at + 22].copy_from_slice(&size.to_le_bytes());
            file[at + 22..at + 26].copy_from_slice(&size.to_le_bytes());
            file[at + 26..at + 28].copy_from_slice(&name.to_le_bytes());
            file[at + 28..at + 30].copy_from_slice(&extra.to_le_bytes());
        };
        absurd(1000, 0, u32::MAX - 1, u16::MAX, u16::MAX);
        absurd(300_000, 8, 0, u16::MAX, u16::MAX);
        absurd(600_000, 0, u32::MAX, 0, 0);
        absurd((1 << 20) - 200, 8, 0, 10, 0);
        file.extend_from_slice(&ZIP_ENTRY[..]);
        file.extend_from_slice(&[20, 0, 8]);
        let cut = pieces(&file);
        let cuts: Vec<usize> = cut.iter().map(|p| p.offset as usize).collect();
        // Large claims cut; the malformed zip64 one falls back to the
        // old rule (512 bytes in), which it meets.
        assert!(cuts.contains(&1000) && cuts.contains(&600_000), "{cuts:?}");
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
