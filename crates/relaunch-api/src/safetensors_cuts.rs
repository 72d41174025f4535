//! Where a safetensors file's chunks end: the part of the chunker
//! ([`crate::files::Chunks`]) that reads a safetensors header.
//!
//! A safetensors file is 8 bytes of header length, the header (JSON naming
//! each tensor's dtype, shape and `data_offsets` in the data that follows,
//! and optional `__metadata__`), then the tensors' bytes. The header is a
//! chunk of its own, so a header that changed (metadata, a tensor added or
//! renamed) costs the header and shifts no data chunk; each tensor of at
//! least [`LARGE_ENTRY`] bytes starts a chunk and ends one, so a changed
//! tensor costs its own bytes, not its neighbours'; smaller tensors are
//! grouped as small zip entries are (a chunk ends before one only at least
//! [`ENTRY_GROUP`] bytes after the group began). The cuts are planned from
//! the header alone, so they are a function of the file's bytes.

use std::collections::VecDeque;

use crate::chunk_limits::CHUNK_MAX;
use crate::zip_cuts::{ENTRY_GROUP, LARGE_ENTRY};

/// The safetensors format's own limit on the header's length.
const MAX_HEADER: u64 = 100_000_000;
/// Most tensors whose boundaries are planned; past it the rest are cut
/// by FastCDC alone.
const MAX_TENSORS: usize = 1 << 20;

/// The planned cuts of a safetensors file whose first bytes are `block`:
/// the header's end, then tensor boundaries, ascending file offsets; None
/// when `block` does not start with a whole safetensors header of at most
/// [`CHUNK_MAX`] bytes.
pub fn plan(block: &[u8]) -> Option<VecDeque<u64>> {
    let len = u64::from_le_bytes(block.get(..8)?.try_into().ok()?);
    if !(2..=MAX_HEADER).contains(&len) || 8 + len > CHUNK_MAX as u64 {
        return None;
    }
    let header = block.get(8..8 + len as usize)?;
    if header.first() != Some(&b'{') {
        return None;
    }
    let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let data = 8 + len;
    let mut spans: Vec<(u64, u64)> = parsed
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(_, tensor)| {
            let offsets = tensor.get("data_offsets")?.as_array()?;
            let (begin, end) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
            (begin <= end).then_some((begin, end))
        })
        .take(MAX_TENSORS)
        .collect();
    spans.sort_unstable();
    let mut cuts = VecDeque::with_capacity(2 * spans.len() + 1);
    cuts.push_back(data);
    let mut group = 0u64;
    for (begin, end) in spans {
        let (begin, end) = (data.checked_add(begin)?, data.checked_add(end)?);
        if end - begin >= LARGE_ENTRY as u64 {
            cuts.push_back(begin);
            cuts.push_back(end);
            group = end;
        } else if begin >= group + ENTRY_GROUP as u64 {
            cuts.push_back(begin);
            group = begin;
        }
    }
    // Ascending and each past the one before (overlapping spans in a
    // malformed header must not cut backwards).
    let mut last = 0;
    cuts.retain(|&c| {
        let keep = c > last;
        last = last.max(c);
        keep
    });
    Some(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zip_cuts::tests::{pieces, sent};

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        crate::files::tests::noise(len, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A safetensors file of `tensors` (name, bytes) in that order, with
    /// `metadata` in its header.
    fn safetensors(tensors: &[(&str, Vec<u8>)], metadata: &str) -> (Vec<u8>, u64) {
        let mut header = format!("{{\"__metadata__\":{{\"step\":\"{metadata}\"}}");
        let mut at = 0;
        for (name, data) in tensors {
            let n = data.len();
            header += &format!(
                ",\"{name}\":{{\"dtype\":\"U8\",\"shape\":[{n}],\"data_offsets\":[{at},{}]}}",
                at + n
            );
            at += n;
        }
        header.push('}');
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        let data = file.len() as u64;
        for (_, bytes) in tensors {
            file.extend_from_slice(bytes);
        }
        (file, data)
    }

    fn model(changed: &[usize]) -> Vec<(String, Vec<u8>)> {
        let sizes = [3 << 20, 4096, 300 << 10, 8, 1 << 20, 40 << 10, 64, 2 << 20];
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let seed = if changed.contains(&i) { 100 + i } else { i } as u64;
                (format!("layer.{i}"), noise(n, seed))
            })
            .collect()
    }

    fn file(tensors: &[(String, Vec<u8>)], metadata: &str) -> (Vec<u8>, u64) {
        let named: Vec<(&str, Vec<u8>)> = tensors
            .iter()
            .map(|(n, d)| (n.as_str(), d.clone()))
            .collect();
        safetensors(&named, metadata)
    }

    #[test]
    fn the_header_and_each_large_tensor_are_chunks_of_their_own() {
        let tensors = model(&[]);
        let (bytes, data) = file(&tensors, "100");
        let cuts: Vec<u64> = pieces(&bytes).iter().map(|p| p.offset).collect();
        assert_eq!(cuts[..2], [0, data]);
        let mut at = data;
        for (_, t) in &tensors {
            if t.len() >= LARGE_ENTRY {
                let end = at + t.len() as u64;
                assert!(cuts.contains(&at), "tensor at {at}");
                assert!(
                    end == bytes.len() as u64 || cuts.contains(&end),
                    "its end {end}"
                );
            }
            at += t.len() as u64;
        }
    }

    #[test]
    fn new_metadata_costs_the_header_and_a_changed_tensor_its_bytes() {
        let (first, _) = file(&model(&[]), "100");
        let old = pieces(&first);
        // Only the header's metadata changes: the header is all that is sent.
        let (second, data) = file(&model(&[]), "200");
        let new = pieces(&second);
        assert_eq!(sent(&old, &new), data as usize);
        // Two tensors change (1 MiB and 8 bytes): about their bytes are sent.
        let (third, data) = file(&model(&[3, 4]), "300");
        let extra = sent(&new, &pieces(&third));
        assert!(
            extra >= (1 << 20) && extra <= data as usize + (1 << 20) + 2 * ENTRY_GROUP,
            "{extra}"
        );
    }

    #[test]
    fn what_is_not_a_safetensors_header_plans_nothing() {
        for bad in [
            &b""[..],
            b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
            b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!",
            b"\xff\xff\xff\xff\xff\xff\xff\xff{",
            b"\x04\x00\x00\x00\x00\x00\x00\x00{\"a\"",
        ] {
            let planned = plan(bad);
            assert!(
                planned.is_none() || planned == Some(VecDeque::from([10])),
                "{bad:?}"
            );
        }
        // Offsets that overlap or run backwards never cut backwards.
        let header = br#"{"a":{"data_offsets":[100000,40000]},"b":{"data_offsets":[0,90000]},"c":{"data_offsets":[50000,200000]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&noise(300_000, 1));
        let planned: Vec<u64> = plan(&bytes).unwrap().into();
        assert!(planned.windows(2).all(|w| w[0] < w[1]), "{planned:?}");
        pieces(&bytes);
    }
}
