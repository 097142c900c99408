//! Building safetensors headers.

use std::collections::{BTreeMap, HashSet};

use super::json::METADATA_KEY;
use super::{byte_len, Error, LEN_PREFIX, MAX_HEADER_LEN};
use crate::dtype::Dtype;

/// Builds a complete, valid safetensors header for tensors laid out contiguously in the given
/// order, starting at data offset 0: the 8-byte little-endian length followed by compact JSON
/// padded with spaces so that its length (and so the data start) is a multiple of 8, as the
/// official writer does.
///
/// The JSON has `__metadata__` first (if given, keys in sorted order), then the tensors in the
/// given order, each as `{"dtype":..,"shape":[..],"data_offsets":[begin,end]}`, with strings
/// escaped exactly as serde_json escapes them. For tensors given in the official writer's order
/// (dtype alignment descending, then name) and at most one metadata key, the output is
/// byte-identical to the official crate's header. The caller appends each tensor's data, in the
/// same order, right after the header.
///
/// Errors: a duplicate name ([`Error::DuplicateTensor`]), a tensor named `__metadata__`
/// ([`Error::ReservedName`]), a tensor or total size beyond 2^64 bytes ([`Error::SizeOverflow`],
/// [`Error::DataTooLarge`]), or a header longer than [`MAX_HEADER_LEN`]
/// ([`Error::HeaderTooLarge`]).
pub fn write_header(
    tensors: &[(String, Dtype, Vec<u64>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>, Error> {
    let mut json = Vec::new();
    json.push(b'{');
    let mut first = true;
    if let Some(metadata) = metadata {
        write_str(&mut json, METADATA_KEY);
        json.extend_from_slice(b":{");
        for (i, (key, value)) in metadata.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            write_str(&mut json, key);
            json.push(b':');
            write_str(&mut json, value);
        }
        json.push(b'}');
        first = false;
    }

    let mut names: HashSet<&str> = HashSet::new();
    let mut offset: u64 = 0;
    for (name, dtype, shape) in tensors {
        if name == METADATA_KEY {
            return Err(Error::ReservedName);
        }
        if !names.insert(name) {
            return Err(Error::DuplicateTensor { tensor: name.clone() });
        }
        let len = byte_len(*dtype, shape).ok_or_else(|| Error::SizeOverflow {
            tensor: name.clone(),
            shape: shape.clone(),
            dtype: *dtype,
        })?;
        let end = offset.checked_add(len).ok_or_else(|| Error::DataTooLarge { tensor: name.clone() })?;

        if !first {
            json.push(b',');
        }
        first = false;
        write_str(&mut json, name);
        json.extend_from_slice(b":{\"dtype\":");
        write_str(&mut json, dtype.safetensors_name());
        json.extend_from_slice(b",\"shape\":[");
        for (i, dim) in shape.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            json.extend_from_slice(dim.to_string().as_bytes());
        }
        json.extend_from_slice(format!("],\"data_offsets\":[{offset},{end}]}}").as_bytes());
        offset = end;
    }
    json.push(b'}');

    let padded_len = json.len().next_multiple_of(LEN_PREFIX as usize);
    json.resize(padded_len, b' ');
    let n = json.len() as u64;
    if n > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge { header_len: n, max: MAX_HEADER_LEN });
    }
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Appends `s` as a JSON string literal, escaped exactly like serde_json does: `"` and `\`
/// backslash-escaped, control characters as `\b \t \n \f \r` or `\u00xx` (lowercase hex),
/// everything else (including non-ASCII and DEL) verbatim.
pub(super) fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x00..=0x1f => {
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]])
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}
