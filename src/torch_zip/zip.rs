//! The zip central directory (ZIP64 included), read only as far as `torch.save` archives need:
//! each entry's name, compression method, flags and where its data lies in the file. Nothing is
//! decompressed; every offset and length is checked against the bytes present before use.

use super::Error;
use std::ops::Range;

/// End of central directory record.
const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD_LEN: usize = 22;
/// ZIP64 end of central directory locator (right before the EOCD record) and record.
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const EOCD64_LOCATOR_LEN: usize = 20;
const EOCD64_SIG: u32 = 0x0606_4b50;
const EOCD64_LEN: usize = 56;
/// Central directory file header and local file header.
const CENTRAL_SIG: u32 = 0x0201_4b50;
const CENTRAL_LEN: usize = 46;
const LOCAL_SIG: u32 = 0x0403_4b50;
const LOCAL_LEN: usize = 30;
/// Extra field holding the 64-bit sizes and offset of a ZIP64 entry.
const ZIP64_EXTRA_ID: u16 = 0x0001;
/// Longest zip comment: the EOCD record is searched for within this many bytes of the end.
const MAX_COMMENT: usize = 0xffff;
/// General purpose flag bit 0: the entry is encrypted.
const FLAG_ENCRYPTED: u16 = 1;
/// Most entries accepted. A torch archive has one per storage plus a handful; a million is far
/// beyond any real checkpoint and keeps the entry table of a hostile file small.
pub(crate) const MAX_ENTRIES: usize = 1 << 20;
/// Largest central directory read (its names are copied): about 100 bytes per entry in a torch
/// archive, so this is far beyond real checkpoints.
pub(crate) const MAX_DIRECTORY_LEN: u64 = 64 << 20;

/// One archive entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Name as stored (torch writes UTF-8 names; others are decoded lossily and never match).
    pub name: String,
    /// Compression method: 0 = stored.
    pub method: u16,
    /// Uncompressed size.
    pub size: u64,
    /// Where the entry's (possibly compressed) data lies in the archive.
    pub data: Range<u64>,
}

/// Little-endian reads that fail instead of panicking on short input.
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

fn bad(reason: impl Into<String>) -> Error {
    Error::Zip(reason.into())
}

/// Reads the central directory of `file` and locates each entry's data through its local header.
pub fn entries(file: &[u8]) -> Result<Vec<Entry>, Error> {
    let eocd = find_eocd(file)?;
    let short = || bad("truncated end of central directory record");
    let mut count = u64::from(u16_at(file, eocd + 10).ok_or_else(short)?);
    let mut cd_size = u64::from(u32_at(file, eocd + 12).ok_or_else(short)?);
    let mut cd_offset = u64::from(u32_at(file, eocd + 16).ok_or_else(short)?);
    // ZIP64: the locator sits right before the EOCD record and points to the 64-bit record.
    if let Some(loc) = eocd.checked_sub(EOCD64_LOCATOR_LEN).filter(|&l| u32_at(file, l) == Some(EOCD64_LOCATOR_SIG)) {
        let at = u64_at(file, loc + 8).ok_or_else(|| bad("truncated ZIP64 locator"))?;
        let at = usize::try_from(at).map_err(|_| bad("ZIP64 record offset out of range"))?;
        if u32_at(file, at) != Some(EOCD64_SIG) || file.len() < at.saturating_add(EOCD64_LEN) {
            return Err(bad("ZIP64 end of central directory record missing"));
        }
        count = u64_at(file, at + 32).ok_or_else(|| bad("truncated ZIP64 record"))?;
        cd_size = u64_at(file, at + 40).ok_or_else(|| bad("truncated ZIP64 record"))?;
        cd_offset = u64_at(file, at + 48).ok_or_else(|| bad("truncated ZIP64 record"))?;
    }
    let cd_end = cd_offset
        .checked_add(cd_size)
        .filter(|&e| e <= eocd as u64)
        .ok_or_else(|| bad(format!("central directory at {cd_offset} (+{cd_size} bytes) lies outside the archive")))?;
    if cd_size > MAX_DIRECTORY_LEN {
        return Err(bad(format!("central directory of {cd_size} bytes (at most {MAX_DIRECTORY_LEN} read)")));
    }
    if count > MAX_ENTRIES as u64 {
        return Err(bad(format!("{count} entries (at most {MAX_ENTRIES} accepted)")));
    }
    let directory = &file[cd_offset as usize..cd_end as usize];
    let mut out = Vec::new();
    let mut at = 0usize;
    for i in 0..count {
        let (entry, next) =
            central_entry(file, directory, at).ok_or_else(|| bad(format!("central entry {i} damaged")))?;
        out.push(entry?);
        at = next;
    }
    Ok(out)
}

/// The offset of the EOCD record: the last signature whose comment length reaches exactly to the
/// end of the file.
fn find_eocd(file: &[u8]) -> Result<usize, Error> {
    let last = file.len().checked_sub(EOCD_LEN).ok_or_else(|| bad("too short for a zip archive"))?;
    let first = last.saturating_sub(MAX_COMMENT);
    (first..=last)
        .rev()
        .find(|&at| {
            u32_at(file, at) == Some(EOCD_SIG)
                && u16_at(file, at + 20).is_some_and(|c| at + EOCD_LEN + c as usize == file.len())
        })
        .ok_or_else(|| bad("no end of central directory record"))
}

/// Parses the central entry at `directory[at..]`; returns it and the offset of the next one.
/// `None`: the entry is cut short or has a wrong signature.
fn central_entry(file: &[u8], directory: &[u8], at: usize) -> Option<(Result<Entry, Error>, usize)> {
    if u32_at(directory, at)? != CENTRAL_SIG {
        return None;
    }
    let flags = u16_at(directory, at + 8)?;
    let method = u16_at(directory, at + 10)?;
    let mut compressed = u64::from(u32_at(directory, at + 20)?);
    let mut size = u64::from(u32_at(directory, at + 24)?);
    let name_len = usize::from(u16_at(directory, at + 28)?);
    let extra_len = usize::from(u16_at(directory, at + 30)?);
    let comment_len = usize::from(u16_at(directory, at + 32)?);
    let mut local = u64::from(u32_at(directory, at + 42)?);
    let name_start = at + CENTRAL_LEN;
    let name = directory.get(name_start..name_start + name_len)?;
    let extra = directory.get(name_start + name_len..name_start + name_len + extra_len)?;
    let next = name_start + name_len + extra_len + comment_len;
    if next > directory.len() {
        return None;
    }
    // The ZIP64 extra field holds, in this order, only the fields whose 32-bit value is all ones.
    let mut e = 0;
    while e + 4 <= extra.len() {
        let id = u16_at(extra, e)?;
        let len = usize::from(u16_at(extra, e + 2)?);
        let body = extra.get(e + 4..e + 4 + len)?;
        if id == ZIP64_EXTRA_ID {
            let mut f = 0;
            for field in [&mut size, &mut compressed, &mut local] {
                if *field == u64::from(u32::MAX) {
                    *field = u64_at(body, f)?;
                    f += 8;
                }
            }
        }
        e += 4 + len;
    }
    let name = String::from_utf8_lossy(name).into_owned();
    if flags & FLAG_ENCRYPTED != 0 {
        return Some((Err(bad(format!("entry {name:?} is encrypted"))), next));
    }
    Some((local_data(file, local, compressed, name.clone()).map(|data| Entry { name, method, size, data }), next))
}

/// The data range of the entry whose local header is at `local`: the header's own name and extra
/// lengths (torch pads the local extra field to align tensor data) decide where the data starts.
fn local_data(file: &[u8], local: u64, compressed: u64, name: String) -> Result<Range<u64>, Error> {
    let damaged = |what: &str| bad(format!("entry {name:?}: {what}"));
    let at = usize::try_from(local).map_err(|_| damaged("local header out of range"))?;
    if u32_at(file, at) != Some(LOCAL_SIG) {
        return Err(damaged("no local header where the central directory says"));
    }
    let name_len = u16_at(file, at + 26).ok_or_else(|| damaged("truncated local header"))?;
    let extra_len = u16_at(file, at + 28).ok_or_else(|| damaged("truncated local header"))?;
    let start = local + (LOCAL_LEN + usize::from(name_len) + usize::from(extra_len)) as u64;
    if file.get(at + LOCAL_LEN..at + LOCAL_LEN + usize::from(name_len)) != Some(name.as_bytes()) {
        return Err(damaged("local header names another entry"));
    }
    let end = start.checked_add(compressed).filter(|&e| e <= file.len() as u64);
    let end = end.ok_or_else(|| damaged("data runs past the end of the archive"))?;
    Ok(start..end)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored (method 0) archive written by hand: local header, data, central directory,
    /// EOCD; with `zip64`, the sizes and offset live in the ZIP64 extra field and records.
    pub(crate) fn archive(files: &[(&str, &[u8])], zip64: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in files {
            let local = out.len() as u32;
            out.extend(LOCAL_SIG.to_le_bytes());
            out.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((name.len() as u16).to_le_bytes());
            out.extend(3u16.to_le_bytes());
            out.extend(name.as_bytes());
            out.extend([0xAA; 3]); // padding in the local extra field, as torch aligns data
            out.extend(*data);
            central.extend(CENTRAL_SIG.to_le_bytes());
            central.extend([45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            let (small, extra): (u32, Vec<u8>) = if zip64 {
                let mut x = ZIP64_EXTRA_ID.to_le_bytes().to_vec();
                x.extend(24u16.to_le_bytes());
                x.extend((data.len() as u64).to_le_bytes());
                x.extend((data.len() as u64).to_le_bytes());
                x.extend(u64::from(local).to_le_bytes());
                (u32::MAX, x)
            } else {
                (data.len() as u32, Vec::new())
            };
            central.extend(small.to_le_bytes());
            central.extend(small.to_le_bytes());
            central.extend((name.len() as u16).to_le_bytes());
            central.extend((extra.len() as u16).to_le_bytes());
            central.extend([0; 6]);
            central.extend(0u32.to_le_bytes());
            central.extend(if zip64 { u32::MAX } else { local }.to_le_bytes());
            central.extend(name.as_bytes());
            central.extend(extra);
        }
        let cd_offset = out.len() as u64;
        out.extend(&central);
        if zip64 {
            let record = out.len() as u64;
            out.extend(EOCD64_SIG.to_le_bytes());
            out.extend(44u64.to_le_bytes());
            out.extend([45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend((files.len() as u64).to_le_bytes());
            out.extend((files.len() as u64).to_le_bytes());
            out.extend((central.len() as u64).to_le_bytes());
            out.extend(cd_offset.to_le_bytes());
            out.extend(EOCD64_LOCATOR_SIG.to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend(record.to_le_bytes());
            out.extend(1u32.to_le_bytes());
        }
        out.extend(EOCD_SIG.to_le_bytes());
        out.extend([0; 4]);
        let n = if zip64 { u16::MAX } else { files.len() as u16 };
        out.extend(n.to_le_bytes());
        out.extend(n.to_le_bytes());
        out.extend((central.len() as u32).to_le_bytes());
        out.extend(if zip64 { u32::MAX } else { cd_offset as u32 }.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out
    }

    #[test]
    fn reads_plain_and_zip64_directories() {
        for zip64 in [false, true] {
            let file = archive(&[("a/data.pkl", b"xyz"), ("a/data/0", b"0123")], zip64);
            let e = entries(&file).unwrap();
            assert_eq!(e.len(), 2, "zip64 {zip64}");
            assert_eq!(e[0].name, "a/data.pkl");
            assert_eq!(&file[e[0].data.start as usize..e[0].data.end as usize], b"xyz");
            assert_eq!(&file[e[1].data.start as usize..e[1].data.end as usize], b"0123");
            assert_eq!((e[1].method, e[1].size), (0, 4));
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for zip64 in [false, true] {
            let file = archive(&[("a/data.pkl", b"xyz"), ("a/data/0", b"0123")], zip64);
            for len in 0..file.len() {
                assert!(entries(&file[..len]).is_err(), "zip64 {zip64}, {len} bytes");
            }
        }
    }
}
