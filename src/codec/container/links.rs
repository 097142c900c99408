//! Reference segments (docs/format.md, "Reference segments"): a segment whose bytes are those
//! of an earlier segment (a copy: a tensor saved twice, tied embeddings), or are coded as the
//! XOR residual against a cross-precision prediction from an earlier segment (a derived
//! segment: the bf16 copy of fp32 weights in the same file). Reading checks every reference
//! before anything is decoded, so a chain is at most two deep: a copy of a derived segment of
//! a coded one.

use super::{Container, Segment};
use crate::codec::cross_precision::{self, Conversion};
use crate::codec::{decode_chunk, Error, Grouping, Result};
use crate::dtype::Dtype;

/// Bit 7 of a segment record's dtype byte: a reference segment, whose record goes on with
/// [`LINK_RECORD_LEN`] bytes.
pub(super) const LINK_FLAG: u8 = 0x80;
/// The bytes after a reference segment's dtype byte: source (u32 LE) and conversion (u8).
const LINK_RECORD_LEN: usize = 5;

/// Where a reference segment's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLink {
    /// The index of the source segment: an earlier segment of the same container.
    pub source: u32,
    /// `None`: a copy of the source's bytes (no chunks stored). Else the segment's chunks
    /// code the XOR residual against the source converted this way (docs/format.md, "Derived
    /// blobs", for the conversions).
    pub conversion: Option<Conversion>,
}

/// The most chunks (coded and copied) a container with an index of `index_len` bytes may
/// have: 4 per index byte, and at least 2^20 (a coded chunk costs at least 9 index bytes; a
/// copy none, so this bounds what a reader allocates for a hostile file of copies).
pub(super) fn max_chunks(index_len: usize) -> u64 {
    (index_len as u64).saturating_mul(4).max(1 << 20)
}

/// The record bytes after the dtype byte.
pub(super) fn record(link: SegmentLink) -> [u8; LINK_RECORD_LEN] {
    let mut out = [0u8; LINK_RECORD_LEN];
    out[..4].copy_from_slice(&link.source.to_le_bytes());
    out[4] = link.conversion.map_or(0, |c| c as u8);
    out
}

/// Reads segment `s`'s link record at `at` (advanced past it).
pub(super) fn parse(index: &[u8], at: &mut usize, s: usize, version: u16) -> Result<SegmentLink> {
    if version < super::REFERENCE_FORMAT_VERSION {
        return Err(Error::Corrupt(format!("segment {s}: a reference segment in a format-{version} container")));
    }
    let bytes = index
        .get(*at..at.saturating_add(LINK_RECORD_LEN))
        .ok_or_else(|| Error::Corrupt(format!("segment {s}: index truncated in a reference record")))?;
    let source = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    let conversion = match bytes[4] {
        0 => None,
        tag => Some(
            Conversion::from_tag(tag)
                .ok_or_else(|| Error::Corrupt(format!("segment {s}: unknown conversion {tag}")))?,
        ),
    };
    *at += LINK_RECORD_LEN;
    Ok(SegmentLink { source, conversion })
}

/// Checks segment `s` (`len` bytes of `dtype`) against its source among `earlier` (the
/// segments before it): an earlier segment that is not a copy; for a copy, as long; for a
/// derived segment, a coded one (no reference of its own) whose dtype the conversion turns
/// into `dtype`, with as many elements.
pub(super) fn check(link: SegmentLink, s: usize, earlier: &[Segment], len: u64, dtype: Option<Dtype>) -> Result<()> {
    let bad = |reason: String| Error::Corrupt(format!("segment {s}: {reason}"));
    let source = earlier
        .get(link.source as usize)
        .ok_or_else(|| bad(format!("refers to segment {}, which does not come before it", link.source)))?;
    let source_len = source.range.end - source.range.start;
    match (link.conversion, source.link) {
        (_, Some(SegmentLink { conversion: None, .. })) => {
            Err(bad(format!("refers to segment {}, a copy", link.source)))
        }
        (None, _) if source_len != len => {
            Err(bad(format!("a copy of {len} bytes of segment {}, which has {source_len}", link.source)))
        }
        (None, _) => Ok(()),
        (Some(_), Some(_)) => Err(bad(format!("derived from segment {}, itself a reference", link.source))),
        (Some(conversion), None) => match (source.dtype, dtype) {
            (Some(from), Some(to))
                if conversion.fits(from, to) && source_len / from.size() as u64 == len / to.size() as u64 =>
            {
                Ok(())
            }
            _ => Err(bad(format!(
                "derived ({conversion}) from segment {}, whose dtype or length does not fit",
                link.source
            ))),
        },
    }
}

impl Container<'_> {
    /// The link of chunk `i`'s segment, if it is a reference segment; an error for one when
    /// `plain_only` (a delta decode, a grouped decode: reference segments have neither).
    pub(super) fn linked(&self, i: usize, plain_only: bool) -> Result<Option<SegmentLink>> {
        let slot = self.chunks.get(i).ok_or_else(|| Error::InvalidInput(format!("no chunk {i}")))?;
        let link = self.segments[slot.segment as usize].link;
        if link.is_some() && plain_only {
            return Err(Error::InvalidInput(format!(
                "chunk {i} belongs to a reference segment, which has no delta or grouped form"
            )));
        }
        Ok(link)
    }

    /// Decodes chunk `i` of a reference segment into `out`: the source's bytes at the same
    /// place (a copy), or the residual XORed with the prediction from the source's elements of
    /// the chunk (a derived segment).
    pub(super) fn decode_linked_chunk(&self, i: usize, link: SegmentLink, out: &mut [u8]) -> Result<()> {
        let slot = self.chunks[i];
        let segment = &self.segments[slot.segment as usize];
        let source = &self.segments[link.source as usize];
        let within = (slot.original_offset - segment.range.start) as usize;
        if out.len() != slot.original_len as usize {
            return Err(Error::InvalidInput("output length differs from the chunk length".into()));
        }
        let Some(conversion) = link.conversion else {
            let start = source.range.start + within as u64;
            return self.decode_range(start..start + out.len() as u64, out);
        };
        let (from, to) = (source.dtype.expect("checked in open"), segment.dtype.expect("checked in open"));
        let wide = cross_precision::source_range(to, from, within..within + out.len());
        let mut source_bytes = vec![0u8; wide.len()];
        let start = source.range.start + wide.start as u64;
        self.decode_range(start..start + wide.len() as u64, &mut source_bytes)?;
        let mut predicted = vec![0u8; out.len()];
        cross_precision::predict(conversion, &source_bytes, from, to, &mut predicted)?;
        let (payload, _, range, header) = self.checked_payload(i)?;
        decode_chunk(payload, &header, Grouping::for_dtype(Some(to)), Some(&predicted), out)
            .map_err(|e| Error::Corrupt(format!("chunk {i} (original bytes {}..{}): {e}", range.start, range.end)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{checksum, Container, ContainerWriter, FileKind, SegmentInput, FOOTER_LEN, HEADER_LEN};
    use super::{SegmentLink, LINK_FLAG};
    use crate::codec::chunk::Data;
    use crate::codec::cross_precision::Conversion;
    use crate::codec::Options;
    use crate::dtype::Dtype;

    const LEN: usize = 8192;

    /// A container of two F32 segments of `LEN` bytes, the second a copy of the first; and the
    /// offset of the copy's record (its length) in the container.
    fn two_segments() -> (Vec<u8>, usize) {
        let data = crate::test_data::random_bytes(9, LEN as u64);
        let options = Options { chunk_size: 4096, ..Options::default() };
        let mut w =
            ContainerWriter::with_reference_segments(Vec::new(), FileKind::Bytes, 2 * LEN as u64, options).unwrap();
        let part = |link| SegmentInput {
            data: Data::Bytes(&data),
            dtype: Some(Dtype::F32),
            reference: None,
            link,
            row_len: None,
        };
        w.segment_inputs(&[part(None), part(Some(SegmentLink { source: 0, conversion: None }))], &mut |_| {}).unwrap();
        let (bytes, _) = w.finish().unwrap();
        let index_at = u64::from_le_bytes(bytes[bytes.len() - FOOTER_LEN..][..8].try_into().unwrap()) as usize;
        // The count, then the first segment: its record and two chunks of four group entries
        // and a checksum each.
        (bytes, index_at + 4 + 9 + 2 * (4 * 5 + 8))
    }

    /// `bytes` changed by `change`, with the checksum over header and index made right again.
    fn patched(mut bytes: Vec<u8>, change: impl FnOnce(&mut [u8])) -> Vec<u8> {
        change(&mut bytes);
        let footer_at = bytes.len() - FOOTER_LEN;
        let index_at = u64::from_le_bytes(bytes[footer_at..][..8].try_into().unwrap()) as usize;
        let sum = checksum(&bytes[..HEADER_LEN], &bytes[index_at..footer_at], &bytes[footer_at..footer_at + 48]);
        bytes[footer_at + 48..footer_at + 56].copy_from_slice(&sum);
        bytes
    }

    fn refused(bytes: &[u8]) -> String {
        match Container::open(bytes) {
            Ok(_) => panic!("a hostile reference was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_copy_decodes_to_its_source() {
        let (bytes, _) = two_segments();
        let c = Container::open(&bytes).unwrap();
        let mut out = vec![0; 2 * LEN];
        c.decode_into(&mut out).unwrap();
        assert_eq!(out[..LEN], out[LEN..]);
        let mut part = vec![0; 100];
        c.decode_range(LEN as u64 + 4000..LEN as u64 + 4100, &mut part).unwrap();
        assert_eq!(part, out[4000..4100]);
        assert!(bytes.len() < LEN + 200, "{}", bytes.len());
        assert!(c.decode_chunk_groups_into(3, &mut vec![0; 4096], false).is_err());
    }

    #[test]
    fn hostile_references_are_refused_naming_the_segment() {
        let (bytes, at) = two_segments();
        let source = at + 9;
        for (to, why) in [(1u32, "to itself"), (2, "forward, past the end"), (u32::MAX, "far out of range")] {
            let bad = patched(bytes.clone(), |b| b[source..source + 4].copy_from_slice(&to.to_le_bytes()));
            let e = refused(&bad);
            assert!(e.contains("segment 1") && e.contains("does not come before"), "{why}: {e}");
        }
        let unknown = patched(bytes.clone(), |b| b[source + 4] = 9);
        assert!(refused(&unknown).contains("unknown conversion 9"));
        // Widening needs a narrow source: F32 from F32 does not fit.
        let widen = patched(bytes.clone(), |b| b[source + 4] = Conversion::Widen as u8);
        assert!(refused(&widen).contains("does not fit"), "{}", refused(&widen));
        let shorter = patched(bytes.clone(), |b| b[at..at + 8].copy_from_slice(&4096u64.to_le_bytes()));
        assert!(Container::open(&shorter).is_err());
        let old = patched(bytes.clone(), |b| b[8..10].copy_from_slice(&6u16.to_le_bytes()));
        assert!(refused(&old).contains("format-6"), "{}", refused(&old));
        let same = patched(bytes.clone(), |b| b[at + 8] = Dtype::F32.code() | LINK_FLAG);
        assert_eq!(same, bytes, "the record is where the test thinks it is");
    }

    #[test]
    fn a_flood_of_copies_is_refused_before_it_is_allocated() {
        // A source of 300 zero chunks (index entries, no payload), then 5,000 copies of it
        // written by hand: 1.5 million chunks from a 78 KB index.
        let zeros = vec![0u8; 300 * 4096];
        let options = Options { chunk_size: 4096, ..Options::default() };
        let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, zeros.len() as u64, options).unwrap();
        w.segment(&zeros, Some(Dtype::F32)).unwrap();
        let (bytes, _) = w.finish().unwrap();
        let footer_at = bytes.len() - FOOTER_LEN;
        let index_at = u64::from_le_bytes(bytes[footer_at..][..8].try_into().unwrap()) as usize;
        let copies = 5000u32;
        let mut index = (copies + 1).to_le_bytes().to_vec();
        index.extend_from_slice(&bytes[index_at + 4..footer_at]);
        for _ in 0..copies {
            index.extend_from_slice(&(zeros.len() as u64).to_le_bytes());
            index.push(Dtype::F32.code() | LINK_FLAG);
            index.extend_from_slice(&super::record(SegmentLink { source: 0, conversion: None }));
        }
        let mut forged = bytes[..index_at].to_vec();
        forged[8..10].copy_from_slice(&7u16.to_le_bytes());
        forged[16..24].copy_from_slice(&((copies as u64 + 1) * zeros.len() as u64).to_le_bytes());
        forged.extend_from_slice(&index);
        let mut footer = bytes[footer_at..].to_vec();
        footer[8..16].copy_from_slice(&(index.len() as u64).to_le_bytes());
        forged.extend_from_slice(&footer);
        let forged = patched(forged, |_| {});
        let e = refused(&forged);
        assert!(e.contains("more chunks than the index allows"), "{e}");
    }

    #[test]
    fn a_writer_refuses_references_it_cannot_record() {
        let data = [0u8; 64];
        let options = Options { chunk_size: 4096, ..Options::default() };
        let part = |link| SegmentInput { data: Data::Bytes(&data), dtype: None, reference: None, link, row_len: None };
        let copy = Some(SegmentLink { source: 0, conversion: None });
        let mut plain = ContainerWriter::new(Vec::new(), FileKind::Bytes, 128, options.clone()).unwrap();
        assert!(plain.segment_inputs(&[part(None), part(copy)], &mut |_| {}).is_err());
        let mut linked = ContainerWriter::with_reference_segments(Vec::new(), FileKind::Bytes, 128, options).unwrap();
        assert!(linked.segment_inputs(&[part(copy)], &mut |_| {}).is_err());
    }
}
