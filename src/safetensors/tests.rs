//! Tests of the safetensors parser and header writer, with the official crate as reference.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

use super::*;
use crate::dtype::ALL_DTYPES;

// ---------------------------------------------------------------------------------------------
// helpers

/// A file made of a length prefix, `json` verbatim and `data_len` zero bytes.
fn file(json: &str, data_len: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

fn err(json: &str, data_len: usize) -> Error {
    parse(&file(json, data_len)).expect_err("should be rejected")
}

fn msg(json: &str, data_len: usize) -> String {
    err(json, data_len).to_string()
}

fn official(d: Dtype) -> safetensors::Dtype {
    use safetensors::Dtype as O;
    match d {
        Dtype::Bool => O::BOOL,
        Dtype::U8 => O::U8,
        Dtype::I8 => O::I8,
        Dtype::F8E5M2 => O::F8_E5M2,
        Dtype::F8E4M3 => O::F8_E4M3,
        Dtype::I16 => O::I16,
        Dtype::U16 => O::U16,
        Dtype::F16 => O::F16,
        Dtype::Bf16 => O::BF16,
        Dtype::I32 => O::I32,
        Dtype::U32 => O::U32,
        Dtype::F32 => O::F32,
        Dtype::F64 => O::F64,
        Dtype::I64 => O::I64,
        Dtype::U64 => O::U64,
    }
}

type Spec = (String, Dtype, Vec<u64>);

/// Whether the official writer can serialize this: safetensors 0.8 writes the invalid JSON
/// `{},"__metadata__":{}}` for an empty metadata map and no tensors (it passes
/// `tensors + metadata entries` = 0 as the map length to serde_json).
fn official_can_write(specs: &[Spec], metadata: Option<&BTreeMap<String, String>>) -> bool {
    !(specs.is_empty() && metadata.is_some_and(BTreeMap::is_empty))
}

/// Serializes tensors with the official crate (filled with pseudo-random data).
fn official_serialize(tensors: &[Spec], metadata: Option<&BTreeMap<String, String>>, seed: u64) -> Vec<u8> {
    let datas: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| crate::test_data::random_bytes(seed.wrapping_add(i as u64), byte_len(*d, s).unwrap()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&datas)
        .map(|((name, d, s), data)| {
            let shape = s.iter().map(|&x| x as usize).collect();
            (name.clone(), TensorView::new(official(*d), shape, data).unwrap())
        })
        .collect();
    let meta: Option<HashMap<String, String>> =
        metadata.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    safetensors::serialize(views, meta).unwrap()
}

/// Invariants of every successfully parsed header.
fn check_invariants(h: &Header, file: &[u8]) {
    assert_eq!(h.file_len, file.len() as u64);
    assert_eq!(h.data_start, h.raw.len() as u64);
    assert_eq!(&file[..h.raw.len()], &h.raw[..]);
    let mut names = std::collections::HashSet::new();
    let mut max_end = h.data_start;
    for (i, t) in h.tensors.iter().enumerate() {
        assert!(names.insert(t.name.clone()), "duplicate {:?}", t.name);
        assert!(h.data_start <= t.begin && t.begin <= t.end && t.end <= h.file_len);
        assert_eq!(t.len(), t.num_elements() * t.dtype.size() as u64);
        if i > 0 {
            let p = &h.tensors[i - 1];
            assert!((p.begin, &p.name) < (t.begin, &t.name), "not sorted");
        }
        if !t.is_empty() {
            assert!(t.begin >= max_end, "overlap at {:?}", t.name);
            max_end = t.end;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// header length

#[test]
fn too_short() {
    for len in 0..8 {
        let e = parse(&vec![0; len]).unwrap_err();
        assert_eq!(e, Error::TooShort { file_len: len as u64 });
    }
    assert_eq!(
        parse(&[1, 2, 3]).unwrap_err().to_string(),
        "file is 3 bytes long, too short for a safetensors file (which starts with an 8-byte \
         header length)"
    );
}

#[test]
fn header_too_large() {
    let mut f = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let e = parse(&f).unwrap_err();
    assert_eq!(e, Error::HeaderTooLarge { header_len: MAX_HEADER_LEN + 1, max: MAX_HEADER_LEN });
    assert_eq!(
        e.to_string(),
        "header length 100000001 bytes exceeds the maximum of 100000000 bytes (corrupt file, or \
         not a safetensors file)"
    );
    let f = u64::MAX.to_le_bytes();
    assert!(matches!(parse(&f), Err(Error::HeaderTooLarge { header_len: u64::MAX, .. })));
    // Exactly the maximum passes the length check (and then fails on the file length).
    let e = header_len(&MAX_HEADER_LEN.to_le_bytes(), 100).unwrap_err();
    assert!(matches!(e, Error::HeaderPastEnd { .. }));
}

#[test]
fn header_past_end() {
    let mut f = 10u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{}   ");
    let e = parse(&f).unwrap_err();
    assert_eq!(e, Error::HeaderPastEnd { header_len: 10, header_end: 18, file_len: 13 });
    assert_eq!(
        e.to_string(),
        "header length 10 bytes extends past the end of the file: the header would end at byte \
         18 but the file is 13 bytes long (truncated file?)"
    );
}

#[test]
fn header_len_reads_prefix_only() {
    let f = file("{}", 100);
    assert_eq!(header_len(&f[..8], f.len() as u64), Ok(2));
    assert_eq!(header_len(&f, f.len() as u64), Ok(2));
    assert_eq!(header_len(&f[..8], 10), Ok(2));
    assert!(matches!(header_len(&f[..8], 9), Err(Error::HeaderPastEnd { .. })));
    assert_eq!(header_len(&f[..8], 7), Err(Error::TooShort { file_len: 7 }));
    assert_eq!(header_len(&f[..5], 110), Err(Error::PrefixTooShort { needed: 8, available: 5 }));
}

#[test]
fn parse_header_uses_prefix_and_file_len() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let f = file(json, 8);
    let whole = parse(&f).unwrap();
    let n = 8 + json.len();
    assert_eq!(parse_header(&f[..n], f.len() as u64).unwrap(), whole);
    // The file_len given decides the data buffer, not the prefix length.
    assert_eq!(parse_header(&f[..n + 3], 1000).unwrap().file_len, 1000);
    let e = parse_header(&f[..n], (n + 4) as u64).unwrap_err();
    assert!(matches!(e, Error::OffsetsPastEnd { data_len: 4, .. }), "{e}");
    let e = parse_header(&f[..n - 1], f.len() as u64).unwrap_err();
    assert_eq!(e, Error::PrefixTooShort { needed: n as u64, available: (n - 1) as u64 });
    assert_eq!(
        e.to_string(),
        format!("internal error: {} bytes of the file were provided to the parser, {n} are needed", n - 1)
    );
}

// ---------------------------------------------------------------------------------------------
// JSON level

#[test]
fn header_not_utf8() {
    let mut f = 4u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{\xff}}");
    let e = parse(&f).unwrap_err();
    assert_eq!(e, Error::HeaderNotUtf8 { offset: 9 });
    assert_eq!(e.to_string(), "header is not valid UTF-8 (invalid byte sequence at file offset 9)");
}

#[test]
fn invalid_json() {
    for json in [
        "",
        "{",
        "{\"a\":}",
        "{}x",
        "{}\0\0\0",
        "{} }",
        "{,}",
        "{\"__metadata__\":{},}",
        "{\"a\":{\"dtype\":\"U8\",}}",
        "nul",
        "{\"\\ud800\":1}",
    ] {
        let e = err(json, 0);
        assert!(matches!(e, Error::InvalidJson { .. }), "{json:?}: {e:?}");
        assert!(e.to_string().starts_with("header is not valid JSON: "), "{e}");
    }
    assert_eq!(msg("{}x", 0), "header is not valid JSON: trailing characters at line 1 column 3");
}

#[test]
fn top_level_not_object() {
    for (json, found) in [
        ("[]", "an array"),
        ("5", "the number 5"),
        ("-5", "the number -5"),
        ("1.5", "the number 1.5"),
        ("\"x\"", "a string"),
        ("null", "null"),
        ("true", "the boolean true"),
    ] {
        assert_eq!(err(json, 0), Error::NotAnObject { found: found.to_owned() });
    }
    assert_eq!(msg("[]", 0), "header must be a JSON object mapping tensor names to tensor entries, found an array");
}

#[test]
fn entry_not_object() {
    assert_eq!(err(r#"{"w":[1,2]}"#, 0), Error::EntryNotAnObject { tensor: "w".into(), found: "an array".into() });
    assert_eq!(
        msg(r#"{"w":"F32"}"#, 0),
        "tensor \"w\": entry must be an object with \"dtype\", \"shape\" and \"data_offsets\", \
         found a string"
    );
}

#[test]
fn missing_fields() {
    assert_eq!(msg(r#"{"w":{"shape":[],"data_offsets":[0,1]}}"#, 1), "tensor \"w\": missing field \"dtype\"");
    assert_eq!(
        err(r#"{"w":{"dtype":"U8","data_offsets":[0,1]}}"#, 1),
        Error::MissingField { tensor: "w".into(), field: "shape" }
    );
    assert_eq!(
        err(r#"{"w":{"dtype":"U8","shape":[]}}"#, 1),
        Error::MissingField { tensor: "w".into(), field: "data_offsets" }
    );
    assert_eq!(err(r#"{"w":{}}"#, 1), Error::MissingField { tensor: "w".into(), field: "dtype" });
}

#[test]
fn extra_and_duplicate_fields() {
    assert_eq!(
        msg(r#"{"w":{"dtype":"U8","shape":[],"data_offsets":[0,1],"offset":3}}"#, 1),
        "tensor \"w\": unexpected field \"offset\" (only \"dtype\", \"shape\" and \"data_offsets\" \
         are allowed)"
    );
    assert_eq!(
        msg(r#"{"w":{"dtype":"U8","shape":[],"dtype":"U8","data_offsets":[0,1]}}"#, 1),
        "tensor \"w\": field \"dtype\" appears more than once"
    );
    assert_eq!(
        err(r#"{"w":{"dtype":"U8","shape":[],"data_offsets":[0,1],"data_offsets":[0,1]}}"#, 1),
        Error::DuplicateField { tensor: "w".into(), field: "data_offsets" }
    );
    assert_eq!(
        err(r#"{"w":{"dtype":"U8","shape":[],"shape":[],"data_offsets":[0,1]}}"#, 1),
        Error::DuplicateField { tensor: "w".into(), field: "shape" }
    );
}

#[test]
fn wrong_types() {
    let wrong = |entry: &str| err(&format!("{{\"w\":{entry}}}"), 64);
    let shape_expected = "an array of non-negative integers";
    let offsets_expected = "an array of two non-negative integers [begin, end]";
    let cases: Vec<(&str, &str, &str, &str)> = vec![
        (r#"{"dtype":12,"shape":[],"data_offsets":[0,4]}"#, "dtype", "a string", "the number 12"),
        (r#"{"dtype":null,"shape":[],"data_offsets":[0,4]}"#, "dtype", "a string", "null"),
        (r#"{"dtype":["F32"],"shape":[],"data_offsets":[0,4]}"#, "dtype", "a string", "an array"),
        (r#"{"dtype":"F32","shape":"2","data_offsets":[0,4]}"#, "shape", shape_expected, "a string"),
        (r#"{"dtype":"F32","shape":{},"data_offsets":[0,4]}"#, "shape", shape_expected, "an object"),
        (
            r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#,
            "shape",
            shape_expected,
            "an array containing the number -1",
        ),
        (
            r#"{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}"#,
            "shape",
            shape_expected,
            "an array containing the number 1.0",
        ),
        (
            r#"{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}"#,
            "shape",
            shape_expected,
            "an array containing the number 1.8446744073709552e19",
        ),
        (
            r#"{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}"#,
            "shape",
            shape_expected,
            "an array containing an array",
        ),
        (
            r#"{"dtype":"F32","shape":[true],"data_offsets":[0,4]}"#,
            "shape",
            shape_expected,
            "an array containing the boolean true",
        ),
        (r#"{"dtype":"F32","shape":[],"data_offsets":[]}"#, "data_offsets", offsets_expected, "an empty array"),
        (r#"{"dtype":"F32","shape":[],"data_offsets":[0]}"#, "data_offsets", offsets_expected, "an array of 1 element"),
        (
            r#"{"dtype":"F32","shape":[],"data_offsets":[0,4,8]}"#,
            "data_offsets",
            offsets_expected,
            "an array of more than 2 elements",
        ),
        (
            r#"{"dtype":"F32","shape":[],"data_offsets":{"begin":0,"end":4}}"#,
            "data_offsets",
            offsets_expected,
            "an object",
        ),
        (
            r#"{"dtype":"F32","shape":[],"data_offsets":["0","4"]}"#,
            "data_offsets",
            offsets_expected,
            "an array containing a string",
        ),
        (
            r#"{"dtype":"F32","shape":[],"data_offsets":[0,-4]}"#,
            "data_offsets",
            offsets_expected,
            "an array containing the number -4",
        ),
    ];
    for (entry, field, expected, found) in cases {
        assert_eq!(
            wrong(entry),
            Error::WrongType { tensor: "w".into(), field, expected, found: found.into() },
            "{entry}"
        );
    }
    assert_eq!(
        wrong(r#"{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}"#).to_string(),
        "tensor \"w\": field \"shape\" must be an array of non-negative integers, found an array \
         containing the number -1"
    );
}

#[test]
fn unknown_dtype() {
    assert_eq!(
        msg(r#"{"w":{"dtype":"bf16","shape":[],"data_offsets":[0,2]}}"#, 2),
        "tensor \"w\": unsupported dtype \"bf16\" (supported: BOOL, U8, I8, F8_E5M2, F8_E4M3, \
         I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)"
    );
    // Dtypes of the official format that ckpt does not support are rejected by name.
    for (dtype, shape, name) in [
        (safetensors::Dtype::C64, vec![2usize], "C64"),
        (safetensors::Dtype::F8_E8M0, vec![3], "F8_E8M0"),
        (safetensors::Dtype::F4, vec![2, 2], "F4"),
        (safetensors::Dtype::F8_E4M3FNUZ, vec![1], "F8_E4M3FNUZ"),
    ] {
        let n: usize = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        let data = vec![0u8; n];
        let view = TensorView::new(dtype, shape, &data).unwrap();
        let f = safetensors::serialize(vec![("t".to_string(), view)], None).unwrap();
        assert_eq!(parse(&f).unwrap_err(), Error::UnknownDtype { tensor: "t".into(), dtype: name.into() });
    }
}

#[test]
fn duplicate_tensor_name() {
    let json = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                   "w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert_eq!(err(json, 2), Error::DuplicateTensor { tensor: "w".into() });
    assert_eq!(msg(json, 2), "tensor name \"w\" appears more than once in the header");
    // Same name written with a different escape is still the same name.
    let json = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                   "\u0077":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert_eq!(err(json, 2), Error::DuplicateTensor { tensor: "w".into() });
}

#[test]
fn metadata_errors() {
    assert_eq!(
        msg(r#"{"__metadata__":{"a":"1"},"__metadata__":{"a":"1"}}"#, 0),
        "\"__metadata__\" appears more than once in the header"
    );
    assert_eq!(
        msg(r#"{"__metadata__":["a"]}"#, 0),
        "\"__metadata__\" must be an object mapping strings to strings, found an array"
    );
    assert_eq!(err(r#"{"__metadata__":null}"#, 0), Error::MetadataNotObject { found: "null".into() });
    assert_eq!(
        msg(r#"{"__metadata__":{"format":"pt","step":100}}"#, 0),
        "\"__metadata__\" key \"step\": value must be a string, found the number 100"
    );
    assert_eq!(
        err(r#"{"__metadata__":{"k":{"x":"y"}}}"#, 0),
        Error::MetadataValueNotString { key: "k".into(), found: "an object".into() }
    );
    assert_eq!(msg(r#"{"__metadata__":{"k":"1","k":"2"}}"#, 0), "\"__metadata__\" key \"k\" appears more than once");
}

// ---------------------------------------------------------------------------------------------
// layout

#[test]
fn offsets_reversed() {
    let json = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#;
    assert_eq!(err(json, 16), Error::OffsetsReversed { tensor: "w".into(), begin: 8, end: 4 });
    assert_eq!(msg(json, 16), "tensor \"w\": data_offsets [8, 4] has begin greater than end");
}

#[test]
fn offsets_past_end() {
    let json = r#"{"w":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}}"#;
    assert_eq!(msg(json, 64), "tensor \"w\": data_offsets [0, 100) extend past the end of the data buffer (64 bytes)");
    // Even an empty tensor must lie within the buffer.
    let json = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[65,65]}}"#;
    assert_eq!(err(json, 64), Error::OffsetsPastEnd { tensor: "w".into(), begin: 65, end: 65, data_len: 64 });
    let json = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}}"#;
    assert!(matches!(err(json, 64), Error::OffsetsPastEnd { .. }));
}

#[test]
fn overlap() {
    let json = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},
                   "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert_eq!(msg(json, 12), "tensors \"a\" (data_offsets [0, 8)) and \"b\" (data_offsets [4, 12)) overlap");
    // Identical ranges.
    let json = r#"{"y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "x":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}"#;
    assert_eq!(
        err(json, 4),
        Error::Overlap {
            first: "x".into(),
            first_begin: 0,
            first_end: 4,
            second: "y".into(),
            second_begin: 0,
            second_end: 4
        }
    );
    // One inside another, with a disjoint one between in sort order.
    let json = r#"{"big":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},
                   "small":{"dtype":"U8","shape":[2],"data_offsets":[7,9]}}"#;
    assert!(matches!(err(json, 10), Error::Overlap { .. }));
}

#[test]
fn size_overflow() {
    let json = r#"{"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#;
    assert_eq!(msg(json, 0), "tensor \"w\": shape [4294967296, 4294967296] of F64 is larger than 2^64 bytes");
    let json = r#"{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}"#;
    assert_eq!(err(json, 0), Error::SizeOverflow { tensor: "w".into(), shape: vec![1 << 61], dtype: Dtype::F64 });
}

#[test]
fn size_mismatch() {
    let json = r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}"#;
    assert_eq!(
        msg(json, 24),
        "tensor \"w\": shape [2, 3] of F32 needs 24 bytes, but data_offsets [0, 20) span 20 bytes"
    );
    // A scalar is one element.
    let json = r#"{"s":{"dtype":"F32","shape":[],"data_offsets":[0,0]}}"#;
    assert!(matches!(err(json, 4), Error::SizeMismatch { expected: 4, actual: 0, .. }));
    // An empty tensor is zero bytes.
    let json = r#"{"e":{"dtype":"F32","shape":[3,0],"data_offsets":[0,4]}}"#;
    assert!(matches!(err(json, 4), Error::SizeMismatch { expected: 0, actual: 4, .. }));
}

#[test]
fn accepts_scalars_empties_gaps_trailing_bytes() {
    let json = r#"{"__metadata__":{"format":"pt","z":""},
        "gap_after":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},
        "scalar":{"dtype":"F64","shape":[],"data_offsets":[8,16]},
        "empty_inside":{"dtype":"F32","shape":[0,5],"data_offsets":[10,10]},
        "empty_at_end":{"dtype":"BOOL","shape":[0],"data_offsets":[20,20]},
        "empty_at_0":{"dtype":"U8","shape":[7,0,2],"data_offsets":[0,0]}
    }"#;
    let json = format!(" \t\n{json}\r\n \t  ");
    let f = file(&json, 20);
    let h = parse(&f).unwrap();
    check_invariants(&h, &f);
    let d = h.data_start;
    assert_eq!(d, 8 + json.len() as u64);
    assert_eq!(h.raw, &f[..d as usize]);
    let got: Vec<(&str, u64, u64)> = h.tensors.iter().map(|t| (t.name.as_str(), t.begin - d, t.end - d)).collect();
    assert_eq!(
        got,
        vec![
            ("empty_at_0", 0, 0),
            ("gap_after", 0, 4),
            ("scalar", 8, 16),
            ("empty_inside", 10, 10),
            ("empty_at_end", 20, 20),
        ]
    );
    let scalar = &h.tensors[2];
    assert_eq!((scalar.num_elements(), scalar.len(), scalar.is_empty()), (1, 8, false));
    let empty = &h.tensors[0];
    assert_eq!((empty.num_elements(), empty.len(), empty.is_empty()), (0, 0, true));
    assert_eq!(empty.shape, vec![7, 0, 2]);
    assert_eq!(h.metadata, Some(BTreeMap::from([("format".into(), "pt".into()), ("z".into(), String::new())])));

    // Bytes after the last tensor are allowed.
    let f = file(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#, 100);
    assert_eq!(parse(&f).unwrap().tensors.len(), 1);
    // No tensors at all.
    let h = parse(&file("{}", 5)).unwrap();
    assert!(h.tensors.is_empty() && h.metadata.is_none());
}

#[test]
fn names_are_data() {
    let names = ["../../etc/passwd", "/abs", "", "é\u{1F600}", "a\\b", "nul\u{0}byte", "\u{1b}[31m"];
    let specs: Vec<Spec> = names.iter().map(|n| (n.to_string(), Dtype::U8, vec![1])).collect();
    let f = official_serialize(&specs, None, 1);
    let h = parse(&f).unwrap();
    check_invariants(&h, &f);
    let mut got: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    got.sort();
    let mut want = names.to_vec();
    want.sort();
    assert_eq!(got, want);
    // Control characters in names are escaped in messages.
    let json = "{\"\\u001b[31m\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,2]}}";
    assert_eq!(
        msg(json, 2),
        "tensor \"\\u{1b}[31m\": shape [] of U8 needs 1 bytes, but data_offsets [0, 2) span 2 bytes"
    );
}

#[test]
fn every_dtype_round_trips_from_official() {
    for d in ALL_DTYPES {
        let specs: Vec<Spec> =
            vec![("matrix".into(), d, vec![2, 3]), ("scalar".into(), d, vec![]), ("empty".into(), d, vec![4, 0])];
        let f = official_serialize(&specs, None, d.code().into());
        let h = parse(&f).unwrap();
        check_invariants(&h, &f);
        let st = SafeTensors::deserialize(&f).unwrap();
        assert_eq!(h.tensors.len(), 3);
        for t in &h.tensors {
            let o = st.tensor(&t.name).unwrap();
            assert_eq!(o.dtype(), official(t.dtype));
            assert_eq!(t.dtype, d);
            let shape: Vec<u64> = o.shape().iter().map(|&x| x as u64).collect();
            assert_eq!(t.shape, shape);
            assert_eq!(&f[t.begin as usize..t.end as usize], o.data());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// write_header

#[test]
fn write_header_layout() {
    let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
    let specs: Vec<Spec> =
        vec![("b".into(), Dtype::F32, vec![2]), ("a".into(), Dtype::U8, vec![]), ("e".into(), Dtype::I64, vec![0])];
    let h = write_header(&specs, Some(&meta)).unwrap();
    let json = r#"{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[],"data_offsets":[8,9]},"e":{"dtype":"I64","shape":[0],"data_offsets":[9,9]}}"#;
    let padded = format!("{json:<width$}", width = json.len().next_multiple_of(8));
    assert_eq!(&h[8..], padded.as_bytes());
    assert_eq!(u64::from_le_bytes(h[..8].try_into().unwrap()), padded.len() as u64);
    let mut f = h.clone();
    f.resize(h.len() + 9, 7);
    let p = parse(&f).unwrap();
    assert_eq!(p.raw, h);
    assert_eq!(p.metadata, Some(meta));
    // Empty metadata and no tensors (which the official writer gets wrong).
    let h = write_header(&[], Some(&BTreeMap::new())).unwrap();
    assert_eq!(&h[8..], br#"{"__metadata__":{}}     "#);
    assert_eq!(parse(&h).unwrap().metadata, Some(BTreeMap::new()));
    assert_eq!(SafeTensors::deserialize(&h).unwrap().len(), 0);
    // Empty: like the official writer.
    let empty = write_header(&[], None).unwrap();
    assert_eq!(empty, safetensors::serialize(Vec::<(String, TensorView<'_>)>::new(), None).unwrap());
    assert_eq!(&empty[8..], b"{}      ");
}

#[test]
fn write_header_errors() {
    let e = write_header(&[("__metadata__".into(), Dtype::U8, vec![1])], None).unwrap_err();
    assert_eq!(e, Error::ReservedName);
    assert_eq!(e.to_string(), "tensor name \"__metadata__\" is reserved for the header's metadata entry");
    let dup: Vec<Spec> = vec![("x".into(), Dtype::U8, vec![1]), ("x".into(), Dtype::U8, vec![2])];
    assert_eq!(write_header(&dup, None), Err(Error::DuplicateTensor { tensor: "x".into() }));
    let big: Vec<Spec> = vec![("x".into(), Dtype::U16, vec![1 << 32, 1 << 31])];
    assert!(matches!(write_header(&big, None), Err(Error::SizeOverflow { .. })));
    let total: Vec<Spec> = vec![("x".into(), Dtype::U8, vec![1 << 63]), ("y".into(), Dtype::U8, vec![1 << 63])];
    let e = write_header(&total, None).unwrap_err();
    assert_eq!(e, Error::DataTooLarge { tensor: "y".into() });
    assert_eq!(e.to_string(), "tensor \"y\": total data size of the tensors up to this one exceeds 2^64 bytes");
    let meta = BTreeMap::from([("k".to_string(), "x".repeat(MAX_HEADER_LEN as usize))]);
    assert!(matches!(write_header(&[], Some(&meta)), Err(Error::HeaderTooLarge { .. })));
}

// ---------------------------------------------------------------------------------------------
// property tests

fn name_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.]{1,12}",
        "\\PC{0,8}",
        ".{0,6}",
        any::<String>(),
        Just("../../etc/passwd".to_string()),
        Just("model.layers.0.weight".to_string()),
        Just("\u{0}\"\\\n\u{7f}".to_string()),
    ]
    .prop_filter("reserved", |n| n != "__metadata__")
}

fn spec_strategy() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::btree_map(
        name_strategy(),
        (prop::sample::select(ALL_DTYPES.to_vec()), prop::collection::vec(0u64..4, 0..4)),
        0..8,
    )
    .prop_map(|m| m.into_iter().map(|(n, (d, s))| (n, d, s)).collect())
}

fn metadata_strategy() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map(".{0,6}", ".{0,6}", 0..3))
}

proptest! {
    #[test]
    fn official_files_parse_the_same(
        specs in spec_strategy(),
        meta in metadata_strategy(),
        seed in any::<u64>(),
    ) {
        prop_assume!(official_can_write(&specs, meta.as_ref()));
        let f = official_serialize(&specs, meta.as_ref(), seed);
        let h = parse(&f).unwrap();
        check_invariants(&h, &f);
        let (n, official_meta) = SafeTensors::read_metadata(&f).unwrap();
        prop_assert_eq!(h.data_start, 8 + n as u64);
        prop_assert_eq!(h.tensors.len(), specs.len());
        let by_name: BTreeMap<&str, &Spec> = specs.iter().map(|s| (s.0.as_str(), s)).collect();
        for t in &h.tensors {
            let (_, d, s) = by_name[t.name.as_str()];
            prop_assert_eq!((t.dtype, &t.shape), (*d, s));
            let info = official_meta.info(&t.name).unwrap();
            prop_assert_eq!(info.dtype, official(t.dtype));
            prop_assert_eq!(t.begin, h.data_start + info.data_offsets.0 as u64);
            prop_assert_eq!(t.end, h.data_start + info.data_offsets.1 as u64);
        }
        let om: Option<BTreeMap<String, String>> =
            official_meta.metadata().as_ref().map(|m| m.clone().into_iter().collect());
        prop_assert_eq!(&h.metadata, &om);

        // write_header reproduces the official header byte for byte, given the official order
        // (and a metadata map whose order cannot differ).
        if meta.as_ref().is_none_or(|m| m.len() <= 1) {
            let mut ordered = specs.clone();
            ordered.sort_by(|a, b| official(b.1).cmp(&official(a.1)).then(a.0.cmp(&b.0)));
            prop_assert_eq!(write_header(&ordered, meta.as_ref()).unwrap(), h.raw);
        }
    }

    #[test]
    fn written_headers_parse_with_both(
        specs in spec_strategy().prop_shuffle(),
        meta in metadata_strategy(),
        seed in any::<u64>(),
    ) {
        let header = write_header(&specs, meta.as_ref()).unwrap();
        prop_assert_eq!(header.len() % 8, 0);
        let mut f = header.clone();
        let mut expected = Vec::new();
        for (i, (name, d, s)) in specs.iter().enumerate() {
            let begin = f.len() as u64;
            f.extend(crate::test_data::random_bytes(seed.wrapping_add(i as u64), byte_len(*d, s).unwrap()));
            expected.push(TensorInfo {
                name: name.clone(), dtype: *d, shape: s.clone(), begin, end: f.len() as u64,
            });
        }
        expected.sort_by(|a, b| a.begin.cmp(&b.begin).then_with(|| a.name.cmp(&b.name)));

        let h = parse(&f).unwrap();
        check_invariants(&h, &f);
        prop_assert_eq!(&h.raw, &header);
        prop_assert_eq!(&h.tensors, &expected);
        prop_assert_eq!(&h.metadata, &meta);

        let st = SafeTensors::deserialize(&f).unwrap();
        prop_assert_eq!(st.len(), specs.len());
        for t in &h.tensors {
            let o = st.tensor(&t.name).unwrap();
            prop_assert_eq!(o.dtype(), official(t.dtype));
            let shape: Vec<u64> = o.shape().iter().map(|&x| x as u64).collect();
            prop_assert_eq!(&shape, &t.shape);
            prop_assert_eq!(o.data(), &f[t.begin as usize..t.end as usize]);
        }
        let (_, om) = SafeTensors::read_metadata(&f).unwrap();
        let om: Option<BTreeMap<String, String>> =
            om.metadata().as_ref().map(|m| m.clone().into_iter().collect());
        prop_assert_eq!(&om, &meta);
    }

    #[test]
    fn string_escaping_matches_serde_json(s in any::<String>()) {
        let mut out = Vec::new();
        write::write_str(&mut out, &s);
        prop_assert_eq!(out, serde_json::to_vec(&s).unwrap());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(h) = parse(&data) {
            check_invariants(&h, &data);
        }
    }

    #[test]
    fn json_like_headers_never_panic(
        json in "[ {}\\[\\]\":,0-9a-zA-Z_.-]{0,80}",
        extra in 0usize..40,
    ) {
        let f = file(&json, extra);
        if let Ok(h) = parse(&f) {
            check_invariants(&h, &f);
        }
    }

    #[test]
    fn mutated_files_never_panic(
        specs in spec_strategy(),
        meta in metadata_strategy(),
        mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        grow in 0usize..9,
    ) {
        prop_assume!(official_can_write(&specs, meta.as_ref()));
        let mut f = official_serialize(&specs, meta.as_ref(), 7);
        let header_end = 8 + u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
        for (i, b) in mutations {
            // Mostly hit the header, where the interesting structure is.
            let pos = i.index(header_end);
            f[pos] = b;
        }
        if let Some(cut) = cut {
            f.truncate(cut.index(f.len() + 1));
        }
        f.resize(f.len() + grow, 0);
        if let Ok(h) = parse(&f) {
            check_invariants(&h, &f);
        }
    }
}
