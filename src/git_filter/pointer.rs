//! The pointer file git stores in place of a weight file (docs/format.md, "Git pointer"): a
//! version line, then sorted `key value` lines naming the file's hash, manifest and size.
//!
//! Pure: bytes in, bytes out. Parsing is strict and canonical: the only bytes that parse are
//! exactly what [`Pointer::to_bytes`] writes (what `clean` writes), so a pointer git checks out
//! cleans back to the same blob and `git status` stays clean. A key this version does not know
//! makes the bytes not a pointer (clean stores them as content; smudge refuses them, naming
//! the key) instead of being dropped on the next clean, as Git LFS's spec keeps one canonical
//! form of its pointers. `clean` must never take a checkpoint (or a text file that happens to
//! start like a pointer) for a pointer, nor `smudge` a damaged pointer for a reference.

use crate::object_id::ObjectId;

/// The first line of every pointer, newline included.
pub const VERSION_LINE: &str = "version ckpt/1\n";

/// What identifies a file as meant to be a ckpt pointer, of this or another version: `smudge`
/// reports a malformed pointer with this prefix as an error instead of passing it through.
pub const PREFIX: &[u8] = b"version ckpt/";

/// The most bytes a reader looks at to decide whether input is a pointer. ckpt writes
/// pointers of at most 185 bytes (the three keys with a 20-digit size); anything longer is
/// content.
pub const MAX_LEN: usize = 1024;

/// Why bytes are not a valid pointer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Longer than [`MAX_LEN`].
    #[error("{len} bytes, more than a pointer's {MAX_LEN}")]
    TooLong {
        /// The length.
        len: usize,
    },
    /// The first line is not [`VERSION_LINE`].
    #[error("first line is not {:?}", VERSION_LINE.trim_end())]
    Version,
    /// The bytes do not end with a newline (a truncated pointer).
    #[error("does not end with a newline (truncated?)")]
    Truncated,
    /// A line that is not `key value` with a valid key and value.
    #[error("line {line}: {reason}")]
    Line {
        /// The 1-based line number.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A key this version does not know (a pointer written by a later ckpt, or by hand).
    #[error("line {line}: unknown key {key:?} (a ckpt pointer has only hash, manifest and size)")]
    UnknownKey {
        /// The 1-based line number.
        line: usize,
        /// The key.
        key: String,
    },
    /// Keys not in strictly ascending byte order (duplicates included).
    #[error("line {line}: key {key:?} is out of order or repeated")]
    Order {
        /// The 1-based line number.
        line: usize,
        /// The key.
        key: String,
    },
    /// A required key is missing.
    #[error("no {0:?} line")]
    Missing(&'static str),
    /// A known key with a value of the wrong form.
    #[error("{key}: {reason}")]
    Value {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

/// A parsed pointer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pointer {
    /// The file hash (docs/format.md, "file hash"): blake3-derived from the file's segments.
    pub hash: ObjectId,
    /// The manifest object listing the file's segments in the store.
    pub manifest: ObjectId,
    /// The file's length in bytes.
    pub size: u64,
}

impl Pointer {
    /// A pointer.
    pub fn new(hash: ObjectId, manifest: ObjectId, size: u64) -> Pointer {
        Pointer { hash, manifest, size }
    }

    /// The pointer's bytes (its one canonical form): the version line, then `hash`,
    /// `manifest` and `size` lines in that (ascending) order, each ending in `\n`.
    /// `parse(p.to_bytes()) == p`, and whatever parses is `parse(b).to_bytes() == b`.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!("{VERSION_LINE}hash {}\nmanifest {}\nsize {}\n", self.hash.to_hex(), self.manifest.to_hex(), self.size)
            .into_bytes()
    }

    /// Parses `bytes` as a pointer, strictly: exactly [`VERSION_LINE`], then lines `key value\n`
    /// with keys of `a-z 0-9 . -` starting with a letter, in strictly ascending order, values of
    /// printable ASCII (space included, not first), nothing after the last newline; the keys
    /// exactly `hash` and `manifest` (64 lowercase hex digits) and `size` (a decimal u64
    /// without leading zeros): any other key is [`Error::UnknownKey`].
    pub fn parse(bytes: &[u8]) -> Result<Pointer, Error> {
        if bytes.len() > MAX_LEN {
            return Err(Error::TooLong { len: bytes.len() });
        }
        let Some(rest) = bytes.strip_prefix(VERSION_LINE.as_bytes()) else {
            return Err(Error::Version);
        };
        if !rest.is_empty() && !rest.ends_with(b"\n") {
            return Err(Error::Truncated);
        }
        let (mut hash, mut manifest, mut size) = (None, None, None);
        let mut previous: Option<&[u8]> = None;
        // Line 1 is the version line; the last split piece is the empty tail after the final `\n`.
        let body = rest.strip_suffix(b"\n").unwrap_or(rest);
        for (i, line) in body.split(|&b| b == b'\n').enumerate().filter(|_| !rest.is_empty()) {
            let n = i + 2;
            let Some(space) = line.iter().position(|&b| b == b' ') else {
                return Err(Error::Line { line: n, reason: "no space between key and value" });
            };
            let (key, value) = (&line[..space], &line[space + 1..]);
            if !valid_key(key) {
                return Err(Error::Line { line: n, reason: "key is not a-z 0-9 . - starting with a letter" });
            }
            if value.is_empty() || value[0] == b' ' || !value.iter().all(|&b| (0x20..0x7f).contains(&b)) {
                return Err(Error::Line {
                    line: n,
                    reason: "value is empty, starts with a space or is not printable ASCII",
                });
            }
            if previous.is_some_and(|p| p >= key) || key == b"version" {
                return Err(Error::Order { line: n, key: String::from_utf8_lossy(key).into_owned() });
            }
            previous = Some(key);
            // Both checked to be ASCII above.
            let value = std::str::from_utf8(value).expect("printable ASCII");
            match key {
                b"hash" => hash = Some(parse_id("hash", value)?),
                b"manifest" => manifest = Some(parse_id("manifest", value)?),
                b"size" => size = Some(parse_size(value)?),
                _ => return Err(Error::UnknownKey { line: n, key: String::from_utf8_lossy(key).into_owned() }),
            }
        }
        Ok(Pointer {
            hash: hash.ok_or(Error::Missing("hash"))?,
            manifest: manifest.ok_or(Error::Missing("manifest"))?,
            size: size.ok_or(Error::Missing("size"))?,
        })
    }
}

fn valid_key(key: &[u8]) -> bool {
    key.first().is_some_and(u8::is_ascii_lowercase)
        && key.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
}

fn parse_id(key: &'static str, value: &str) -> Result<ObjectId, Error> {
    match value.parse::<ObjectId>() {
        // One spelling per id: lowercase, as ckpt writes it.
        Ok(id) if id.to_hex() == value => Ok(id),
        _ => Err(Error::Value { key, reason: "not 64 lowercase hex digits" }),
    }
}

fn parse_size(value: &str) -> Result<u64, Error> {
    let bad = Error::Value { key: "size", reason: "not a decimal number below 2^64 without leading zeros" };
    if !value.bytes().all(|b| b.is_ascii_digit()) || (value.len() > 1 && value.starts_with('0')) {
        return Err(bad);
    }
    value.parse().map_err(|_| bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Pointer {
        Pointer::new(ObjectId::hash(b"file"), ObjectId::hash(b"manifest"), 1234)
    }

    #[test]
    fn golden_pointer_pins_the_format() {
        let p = Pointer::new(
            ObjectId::from(blake3::Hash::from_bytes([0xab; 32])),
            ObjectId::from(blake3::Hash::from_bytes([0x01; 32])),
            45_000_000,
        );
        let expected =
            format!("version ckpt/1\nhash {}\nmanifest {}\nsize 45000000\n", "ab".repeat(32), "01".repeat(32));
        assert_eq!(String::from_utf8(p.to_bytes()).unwrap(), expected);
        assert_eq!(Pointer::parse(expected.as_bytes()).unwrap(), p);
    }

    #[test]
    fn the_longest_pointer_ckpt_writes_is_under_200_bytes() {
        let p = Pointer::new(ObjectId::hash(b"a"), ObjectId::hash(b"b"), u64::MAX);
        assert_eq!(p.to_bytes().len(), 185);
        assert_eq!(Pointer::parse(&p.to_bytes()).unwrap(), p);
    }

    #[test]
    fn unknown_keys_make_bytes_not_a_pointer() {
        // Whatever their place: a pointer that parsed with them would clean back without them,
        // and its checkout would never be clean in `git status`.
        let good = String::from_utf8(sample().to_bytes()).unwrap();
        for text in [
            good.replace("hash ", "aa.x first value\nhash "),
            good.replace("size 1234\n", "size 1234\nzz-1 2\n"),
            good.replace("manifest ", "lfs 1\nmanifest "),
        ] {
            let e = Pointer::parse(text.as_bytes()).unwrap_err();
            assert!(matches!(e, Error::UnknownKey { .. }), "{text:?}: {e}");
        }
    }

    #[test]
    fn every_malformation_is_rejected_with_its_reason() {
        let good = String::from_utf8(sample().to_bytes()).unwrap();
        let h = ObjectId::hash(b"file").to_hex();
        let cases: Vec<(String, Error)> = vec![
            (String::new(), Error::Version),
            ("version ckpt/2\n".to_string() + &good[15..], Error::Version),
            (good.replace("version ckpt/1\n", "version ckpt/1\r\n"), Error::Version),
            (good[..good.len() - 1].to_string(), Error::Truncated),
            (good[..100].to_string(), Error::Truncated),
            (good.replace("size 1234", "size 01234"), Error::Value { key: "size", reason: "" }),
            (good.replace("size 1234", "size -1"), Error::Value { key: "size", reason: "" }),
            (good.replace("size 1234", "size 18446744073709551616"), Error::Value { key: "size", reason: "" }),
            (good.replace(&h, &h.to_uppercase()), Error::Value { key: "hash", reason: "" }),
            (good.replace(&h, &h[..63]), Error::Value { key: "hash", reason: "" }),
            (good.replace("size 1234\n", ""), Error::Missing("size")),
            (good.replace("size 1234\n", "size 1234\nsize 1234\n"), Error::Order { line: 0, key: String::new() }),
            (good.replace("size 1234\n", "size 1234\nversion x\n"), Error::Order { line: 0, key: String::new() }),
            (good.replace("size 1234\n", "size 1234\nabc 1\n"), Error::Order { line: 0, key: String::new() }),
            (good.replace("size 1234", "size  1234"), Error::Line { line: 0, reason: "" }),
            (good.replace("size 1234", "Size 1234"), Error::Line { line: 0, reason: "" }),
            (good.replace("size 1234", "size 12\t34"), Error::Line { line: 0, reason: "" }),
            (good.replace("size 1234", "size"), Error::Line { line: 0, reason: "" }),
            (good.clone() + "\n", Error::Line { line: 0, reason: "" }),
            (good.clone() + &"x ".repeat(600), Error::TooLong { len: 0 }),
        ];
        for (text, expected) in cases {
            let err = Pointer::parse(text.as_bytes()).unwrap_err();
            assert_eq!(std::mem::discriminant(&err), std::mem::discriminant(&expected), "{text:?}: {err}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Pointer::parse(&bytes);
            let mut prefixed = VERSION_LINE.as_bytes().to_vec();
            prefixed.extend_from_slice(&bytes);
            if let Ok(p) = Pointer::parse(&prefixed) {
                // Whatever parses is canonical: it writes back to the same bytes.
                prop_assert_eq!(p.to_bytes(), prefixed);
            }
        }
    }
}
