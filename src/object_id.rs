//! `ObjectId`: the blake3 hash that names every stored thing (tensor bytes, files, versions).

use std::fmt;
use std::str::FromStr;

/// A 32-byte blake3 digest, displayed as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// Hashes `bytes` with blake3.
    pub fn hash(bytes: &[u8]) -> ObjectId {
        ObjectId(*blake3::hash(bytes).as_bytes())
    }

    /// The raw digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Full lowercase hex form.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from(self.0).to_hex().to_string()
    }

    /// The first `n` hex digits (a short id for display).
    pub fn short(&self, n: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(n.min(64));
        hex
    }
}

/// Feeds `bytes` to `hasher`, on the rayon pool when it has several threads and the input is
/// large enough to split (1 MiB and up); below that the fork-join costs more than it saves.
/// Every bulk hash of the crate goes through here, so the threshold lives in one place.
pub fn hash_update(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    if rayon::current_num_threads() > 1 && bytes.len() >= 1 << 20 {
        hasher.update_rayon(bytes);
    } else {
        hasher.update(bytes);
    }
}

impl From<blake3::Hash> for ObjectId {
    fn from(h: blake3::Hash) -> Self {
        ObjectId(*h.as_bytes())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.short(16))
    }
}

/// Error for a string that is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("not an object id (64 hex digits expected): {0:?}")]
pub struct ParseObjectIdError(pub String);

impl FromStr for ObjectId {
    type Err = ParseObjectIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        blake3::Hash::from_hex(s).map(ObjectId::from).map_err(|_| ParseObjectIdError(s.chars().take(80).collect()))
    }
}

/// Serialized as its 64-digit lowercase hex form (the form manifests and versions use).
impl serde::Serialize for ObjectId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for ObjectId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        // Only the canonical lowercase form: an id has exactly one spelling.
        match s.parse::<ObjectId>() {
            Ok(id) if id.to_hex() == *s => Ok(id),
            _ => Err(serde::de::Error::custom(ParseObjectIdError(s.chars().take(80).collect()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_vector() {
        let id = ObjectId::hash(b"");
        // blake3 of the empty input, from the blake3 test vectors.
        assert_eq!(id.to_hex(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
        assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
        assert_eq!(id.short(8), "af1349b9");
        assert!("xyz".parse::<ObjectId>().is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{}\"", id.to_hex()));
        assert_eq!(serde_json::from_str::<ObjectId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<ObjectId>(&json.to_uppercase()).is_err());
    }
}
