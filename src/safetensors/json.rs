//! Strict single-pass JSON reading of a safetensors header.
//!
//! serde_json drives hand-written visitors, so nothing is parsed into a generic JSON tree and
//! every duplicate key is seen (a `serde_json::Value` or `HashMap` would silently keep one).
//! Visitors report a structured [`Error`] through [`Ctx`] and abort the parse with a serde
//! error; [`parse_json`] prefers the structured error. serde_json limits nesting depth to 128,
//! so hostile input cannot overflow the stack.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::Error;
use crate::dtype::Dtype;

/// The key of the metadata entry.
pub(super) const METADATA_KEY: &str = "__metadata__";

/// One tensor entry as written in the header (offsets relative to the data buffer).
pub(super) struct RawEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// The header's content, entries in document order.
pub(super) struct RawHeader {
    pub entries: Vec<RawEntry>,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Parses the JSON text of a header (leading and trailing JSON whitespace allowed).
pub(super) fn parse_json(text: &str) -> Result<RawHeader, Error> {
    let ctx = Ctx::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let result = de.deserialize_any(TopVisitor { ctx: &ctx }).and_then(|header| de.end().map(|()| header));
    result.map_err(|e| ctx.err.into_inner().unwrap_or_else(|| Error::InvalidJson { detail: e.to_string() }))
}

/// Holds the first structured error a visitor reported.
#[derive(Default)]
struct Ctx {
    err: RefCell<Option<Error>>,
}

impl Ctx {
    /// Records `err` (unless an earlier one is recorded) and returns a serde error that aborts.
    fn fail<E: de::Error>(&self, err: Error) -> E {
        let msg = err.to_string();
        let mut slot = self.err.borrow_mut();
        if slot.is_none() {
            *slot = Some(err);
        }
        E::custom(msg)
    }
}

/// Implements the `visit_*` methods of kinds a visitor does not accept, each calling
/// `self.wrong(description_of_what_was_found)`.
macro_rules! reject {
    (bool) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Err(self.wrong(format!("the boolean {v}")))
        }
    };
    (i64) => {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Err(self.wrong(format!("the number {v}")))
        }
    };
    (u64) => {
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Err(self.wrong(format!("the number {v}")))
        }
    };
    (f64) => {
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(self.wrong(format!("the number {v:?}")))
        }
    };
    (str) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(self.wrong("a string".to_owned()))
        }
    };
    (unit) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(self.wrong("null".to_owned()))
        }
    };
    (seq) => {
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("an array".to_owned()))
        }
    };
    (map) => {
        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("an object".to_owned()))
        }
    };
    ($($kind:ident),+) => {
        $(reject!($kind);)+
    };
}

/// Makes a visitor usable as a seed that reads any JSON value.
macro_rules! seed_via_any {
    ($ty:ident) => {
        impl<'de> DeserializeSeed<'de> for $ty<'_> {
            type Value = <Self as Visitor<'de>>::Value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

/// Reads a JSON object key as an owned string.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        String::deserialize(d)
    }
}

use serde::Deserialize as _;

/// The top-level object.
struct TopVisitor<'c> {
    ctx: &'c Ctx,
}

impl TopVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::NotAnObject { found })
    }
}

impl<'de> Visitor<'de> for TopVisitor<'_> {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to tensor entries")
    }

    reject!(bool, i64, u64, f64, str, unit, seq);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let ctx = self.ctx;
        let mut names: HashSet<String> = HashSet::new();
        let mut entries = Vec::new();
        let mut metadata = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if key == METADATA_KEY {
                if metadata.is_some() {
                    return Err(ctx.fail(Error::DuplicateMetadata));
                }
                metadata = Some(map.next_value_seed(MetadataVisitor { ctx })?);
                continue;
            }
            if names.contains(&key) {
                return Err(ctx.fail(Error::DuplicateTensor { tensor: key }));
            }
            let (dtype, shape, (begin, end)) = map.next_value_seed(EntryVisitor { ctx, name: &key })?;
            names.insert(key.clone());
            entries.push(RawEntry { name: key, dtype, shape, begin, end });
        }
        Ok(RawHeader { entries, metadata })
    }
}

/// The `__metadata__` object.
struct MetadataVisitor<'c> {
    ctx: &'c Ctx,
}

impl MetadataVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::MetadataNotObject { found })
    }
}

seed_via_any!(MetadataVisitor);

impl<'de> Visitor<'de> for MetadataVisitor<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping strings to strings")
    }

    reject!(bool, i64, u64, f64, str, unit, seq);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let ctx = self.ctx;
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if out.contains_key(&key) {
                return Err(ctx.fail(Error::DuplicateMetadataKey { key }));
            }
            let value = map.next_value_seed(MetadataValueVisitor { ctx, key: &key })?;
            out.insert(key, value);
        }
        Ok(out)
    }
}

/// One value of `__metadata__`.
struct MetadataValueVisitor<'c> {
    ctx: &'c Ctx,
    key: &'c str,
}

impl MetadataValueVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::MetadataValueNotString { key: self.key.to_owned(), found })
    }
}

seed_via_any!(MetadataValueVisitor);

impl<'de> Visitor<'de> for MetadataValueVisitor<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    reject!(bool, i64, u64, f64, unit, seq, map);

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
}

/// A tensor entry: `{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}`.
struct EntryVisitor<'c> {
    ctx: &'c Ctx,
    name: &'c str,
}

impl EntryVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::EntryNotAnObject { tensor: self.name.to_owned(), found })
    }
}

seed_via_any!(EntryVisitor);

impl<'de> Visitor<'de> for EntryVisitor<'_> {
    type Value = (Dtype, Vec<u64>, (u64, u64));

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor entry object")
    }

    reject!(bool, i64, u64, f64, str, unit, seq);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (ctx, name) = (self.ctx, self.name);
        let mut dtype = None;
        let mut shape = None;
        let mut offsets = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let (field, already) = match key.as_str() {
                "dtype" => ("dtype", dtype.is_some()),
                "shape" => ("shape", shape.is_some()),
                "data_offsets" => ("data_offsets", offsets.is_some()),
                _ => return Err(ctx.fail(Error::UnknownField { tensor: name.to_owned(), field: key })),
            };
            if already {
                return Err(ctx.fail(Error::DuplicateField { tensor: name.to_owned(), field }));
            }
            match field {
                "dtype" => dtype = Some(map.next_value_seed(DtypeVisitor { ctx, name })?),
                "shape" => shape = Some(map.next_value_seed(ShapeVisitor { ctx, name })?),
                _ => offsets = Some(map.next_value_seed(OffsetsVisitor { ctx, name })?),
            }
        }
        let missing = |field| ctx.fail(Error::MissingField { tensor: name.to_owned(), field });
        let dtype = dtype.ok_or_else(|| missing("dtype"))?;
        let shape = shape.ok_or_else(|| missing("shape"))?;
        let offsets = offsets.ok_or_else(|| missing("data_offsets"))?;
        Ok((dtype, shape, offsets))
    }
}

/// The "dtype" field.
struct DtypeVisitor<'c> {
    ctx: &'c Ctx,
    name: &'c str,
}

impl DtypeVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::WrongType { tensor: self.name.to_owned(), field: "dtype", expected: "a string", found })
    }
}

seed_via_any!(DtypeVisitor);

impl<'de> Visitor<'de> for DtypeVisitor<'_> {
    type Value = Dtype;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a dtype name")
    }

    reject!(bool, i64, u64, f64, unit, seq, map);

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Dtype, E> {
        Dtype::from_safetensors_name(v)
            .ok_or_else(|| self.ctx.fail(Error::UnknownDtype { tensor: self.name.to_owned(), dtype: v.to_owned() }))
    }
}

const SHAPE_EXPECTED: &str = "an array of non-negative integers";
const OFFSETS_EXPECTED: &str = "an array of two non-negative integers [begin, end]";

/// The "shape" field.
struct ShapeVisitor<'c> {
    ctx: &'c Ctx,
    name: &'c str,
}

impl ShapeVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::WrongType {
            tensor: self.name.to_owned(),
            field: "shape",
            expected: SHAPE_EXPECTED,
            found,
        })
    }
}

seed_via_any!(ShapeVisitor);

impl<'de> Visitor<'de> for ShapeVisitor<'_> {
    type Value = Vec<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SHAPE_EXPECTED)
    }

    reject!(bool, i64, u64, f64, str, unit, map);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let element = ElementVisitor { ctx: self.ctx, name: self.name, field: "shape", expected: SHAPE_EXPECTED };
        let mut dims = Vec::new();
        while let Some(dim) = seq.next_element_seed(element.clone())? {
            dims.push(dim);
        }
        Ok(dims)
    }
}

/// The "data_offsets" field.
struct OffsetsVisitor<'c> {
    ctx: &'c Ctx,
    name: &'c str,
}

impl OffsetsVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::WrongType {
            tensor: self.name.to_owned(),
            field: "data_offsets",
            expected: OFFSETS_EXPECTED,
            found,
        })
    }
}

seed_via_any!(OffsetsVisitor);

impl<'de> Visitor<'de> for OffsetsVisitor<'_> {
    type Value = (u64, u64);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(OFFSETS_EXPECTED)
    }

    reject!(bool, i64, u64, f64, str, unit, map);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u64, u64), A::Error> {
        let element =
            ElementVisitor { ctx: self.ctx, name: self.name, field: "data_offsets", expected: OFFSETS_EXPECTED };
        let Some(begin) = seq.next_element_seed(element.clone())? else {
            return Err(self.wrong("an empty array".to_owned()));
        };
        let Some(end) = seq.next_element_seed(element.clone())? else {
            return Err(self.wrong("an array of 1 element".to_owned()));
        };
        if seq.next_element_seed(element)?.is_some() {
            return Err(self.wrong("an array of more than 2 elements".to_owned()));
        }
        Ok((begin, end))
    }
}

/// One element of "shape" or "data_offsets": a non-negative integer that fits in u64.
#[derive(Clone)]
struct ElementVisitor<'c> {
    ctx: &'c Ctx,
    name: &'c str,
    field: &'static str,
    expected: &'static str,
}

impl ElementVisitor<'_> {
    fn wrong<E: de::Error>(&self, found: String) -> E {
        self.ctx.fail(Error::WrongType {
            tensor: self.name.to_owned(),
            field: self.field,
            expected: self.expected,
            found: format!("an array containing {found}"),
        })
    }
}

seed_via_any!(ElementVisitor);

impl<'de> Visitor<'de> for ElementVisitor<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer")
    }

    reject!(bool, f64, str, unit, seq, map);

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| self.wrong(format!("the number {v}")))
    }
}
