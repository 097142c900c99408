use super::*;

fn sample() -> Vec<u8> {
    crate::test_data::xorshift(0x9E3779B97F4A7C15)
        .take(200_000)
        .enumerate()
        .map(|(i, s)| {
            if i % 2 == 1 {
                0x3C + (s % 3) as u8
            } else if i % 1000 < 100 {
                0
            } else {
                s as u8
            }
        })
        .collect()
}

/// Grouped data, as a stored blob hands it over: split on request.
struct Split<'a>(&'a [u8]);

impl crate::codec::chunk::GroupedReference for Split<'_> {
    fn grouped(&self, offset: usize, grouped: &mut [u8]) -> Result<()> {
        let plain = &self.0[offset..offset + grouped.len()];
        crate::codec::byte_group::split(plain, None, Grouping::for_dtype(Some(Dtype::Bf16)), grouped)
    }
}

#[test]
fn grouped_data_records_the_given_hash_and_needs_one() {
    let data = sample();
    let options = Options { chunk_size: 16 << 10, ..Options::default() };
    let source = Split(&data);
    let input = SegmentInput {
        data: Data::Grouped { source: &source, offset: 0, len: data.len() },
        dtype: Some(Dtype::Bf16),
        reference: None,
        link: None,
        row_len: None,
    };
    let hash = blake3::hash(&data);
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options.clone())
        .unwrap()
        .with_given_hash(hash);
    w.segment_inputs(&[input], &mut |_| {}).unwrap();
    let (bytes, recorded) = w.finish().unwrap();
    assert_eq!(recorded, hash);
    let mut out = Vec::new();
    assert_eq!(Container::open(&bytes).unwrap().decode_to(&mut out).unwrap(), hash);
    assert_eq!(out, data);
    // Without a given hash there are no bytes to hash: refused, not a wrong footer.
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
    let err = w.segment_inputs(&[input], &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("grouped data needs the original's hash given"), "{err}");
}

fn build(data: &[u8]) -> Vec<u8> {
    let options = Options { chunk_size: 16 << 10, ..Options::default() };
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Safetensors, data.len() as u64, options).unwrap();
    w.segment(&data[..1000], None).unwrap();
    w.segment(&data[1000..150_000], Some(Dtype::Bf16)).unwrap();
    w.segment(&data[150_000..150_003], None).unwrap();
    w.segment(&data[150_003..150_003], Some(Dtype::F32)).unwrap();
    w.segment(&data[150_003..], Some(Dtype::U8)).unwrap();
    w.finish().unwrap().0
}

#[test]
fn round_trip_and_ranges() {
    let data = sample();
    let bytes = build(&data);
    assert!(bytes.len() < data.len());
    let c = Container::open(&bytes).unwrap();
    assert_eq!(c.segments().len(), 5);
    let mut out = Vec::new();
    c.decode_to(&mut out).unwrap();
    assert_eq!(out, data);
    let mut direct = vec![0u8; data.len()];
    c.decode_into(&mut direct).unwrap();
    assert_eq!(direct, data);
    for range in [0..0u64, 0..1, 999..1001, 5000..70_000, 149_990..150_010, 199_999..200_000] {
        let mut part = vec![0u8; (range.end - range.start) as usize];
        c.decode_range(range.clone(), &mut part).unwrap();
        assert_eq!(part, &data[range.start as usize..range.end as usize]);
    }
}

#[test]
fn every_changed_byte_is_detected() {
    let data = sample();
    let bytes = build(&data);
    // Every byte of the (small) container: flip one bit, expect open or decode to fail.
    let step = (bytes.len() / 3000).max(1);
    for at in (0..bytes.len()).step_by(step).chain(bytes.len() - FOOTER_LEN..bytes.len()) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        let result = Container::open(&bad).and_then(|c| c.decode_to(&mut Vec::new()).map(|_| ()));
        assert!(result.is_err(), "flipped byte {at} of {} went unnoticed", bytes.len());
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    #[test]
    fn random_segments_round_trip(
        parts in proptest::collection::vec((0usize..16, 0usize..3000, proptest::prelude::any::<u64>()), 0..6),
        chunk_kib in proptest::sample::select(vec![4usize, 8, 16]),
    ) {
        let mut data = Vec::new();
        let mut segments = Vec::new();
        for (code, elems, seed) in parts {
            let dtype = Dtype::from_code(code as u8);
            let len = elems * Grouping::for_dtype(dtype).width;
            let start = data.len();
            let stream = crate::test_data::xorshift(seed).take(len).enumerate();
            data.extend(stream.map(|(i, s)| if i % 3 == 0 { 0 } else { (s % 7) as u8 }));
            segments.push((start..data.len(), dtype));
        }
        let options = Options { chunk_size: chunk_kib << 10, ..Options::default() };
        let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
        for (range, dtype) in &segments {
            w.segment(&data[range.clone()], *dtype).unwrap();
        }
        let bytes = w.finish().unwrap().0;
        let c = Container::open(&bytes).unwrap();
        let mut out = Vec::new();
        c.decode_to(&mut out).unwrap();
        proptest::prop_assert_eq!(out, data);
    }
}

/// Pins the format: a fixed input must give exactly these container bytes. If this fails,
/// the on-disk format changed: bump FORMAT_VERSION and update docs/format.md.
#[test]
fn golden_container() {
    let mut data = Vec::new();
    for i in 0..3000u32 {
        let x = ((i % 97) as f32 - 48.0) / 1000.0;
        data.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
    }
    data.extend_from_slice(&[0u8; 100]);
    // A fixed method, so tuning the automatic choice does not move the golden bytes.
    let selection = crate::codec::select::Selection::Only(Method::Huffman);
    let options = Options { chunk_size: 4096, selection, ..Options::default() };
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
    w.segment(&data[..6000], Some(Dtype::Bf16)).unwrap();
    w.segment(&data[6000..], None).unwrap();
    let bytes = w.finish().unwrap().0;
    assert_eq!(&bytes[..32], b"\x89CKZ\r\n\x1a\n\x07\x00\x00\x00\x00\x10\x00\x00\xd4\x17\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(bytes.len(), GOLDEN_LEN, "container length");
    assert_eq!(blake3::hash(&bytes).to_hex().as_str(), GOLDEN_HASH);
}

const GOLDEN_LEN: usize = 3184;
/// Changed for formats 5, 6 and 7 only by the version byte (and so the header checksum).
const GOLDEN_HASH: &str = "ca3f4733c8299a0b999a93642c6f32a53496e471a5b518fc6f328bc0a2ec4964";

#[test]
fn segments_in_parallel_match_one_by_one() {
    let data = sample();
    let cuts = [0usize, 1000, 1000, 70_000, 70_006, 150_000, 200_000];
    let dtypes = [None, Some(Dtype::F32), Some(Dtype::Bf16), None, Some(Dtype::Bf16), Some(Dtype::U8)];
    let options = Options { chunk_size: 4 << 10, ..Options::default() };
    let mut one = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options.clone()).unwrap();
    let mut parts = Vec::new();
    for (k, w) in cuts.windows(2).enumerate() {
        one.segment(&data[w[0]..w[1]], dtypes[k]).unwrap();
        parts.push((&data[w[0]..w[1]], dtypes[k]));
    }
    let mut all = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
    let mut seen = Vec::new();
    all.segments(&parts, &mut |done| seen.push(done)).unwrap();
    assert_eq!(all.finish().unwrap().0, one.finish().unwrap().0);
    assert_eq!(seen.last(), Some(&(data.len() as u64)));
    assert!(seen.windows(2).all(|w| w[0] <= w[1]));
}

/// The coding pipeline (units coded ahead of the writer, window in bytes) gives the same
/// bytes on any pool, from outside any pool, and for tiny, empty and multi-stripe segments.
#[test]
fn pipeline_output_is_the_same_on_every_pool() {
    let mut data = sample();
    data.extend_from_slice(&sample()[..150_000]);
    // Empty and tiny segments between ones of many 32 KiB stripes.
    let lens = [(0, None), (3, Some(Dtype::U8)), (8, None), (4096, Some(Dtype::F32)), (4, Some(Dtype::Bf16))];
    let lens = lens.into_iter().chain([(115_889, None), (2, Some(Dtype::Bf16)), (0, Some(Dtype::F32))]);
    let lens = lens.chain([(180_000, Some(Dtype::F32)), (49_998, None)]);
    let mut parts: Vec<(&[u8], Option<Dtype>)> = Vec::new();
    let mut at = 0;
    for (len, dtype) in lens {
        parts.push((&data[at..at + len], dtype));
        at += len;
    }
    parts.push((&data[at..], Some(Dtype::U8)));
    let code = || {
        let options = Options { chunk_size: 4 << 10, ..Options::default() };
        let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
        w.segments(&parts, &mut |_| {}).unwrap();
        w.finish().unwrap()
    };
    let outside = std::thread::scope(|s| s.spawn(code).join().unwrap());
    assert_eq!(outside.1, blake3::hash(&data));
    // Decoding streams double-buffered batches (here 16 KiB per thread): several of them.
    let decode = || {
        let (mut out, mut seen) = (Vec::new(), Vec::new());
        let c = Container::open(&outside.0).unwrap();
        let hash = c.decode_to_reporting(None, &mut out, &mut |done| seen.push(done)).unwrap();
        (out, hash, seen)
    };
    for threads in [1, 2, 3, 5] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert_eq!(pool.install(code), outside, "{threads} threads");
        let (out, hash, seen) = pool.install(decode);
        assert!(out == data && hash == outside.1, "{threads} threads");
        assert!(seen.len() >= 2 && seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(seen.last(), Some(&(data.len() as u64)));
    }
    let (out, _, _) = std::thread::scope(|s| s.spawn(decode).join().unwrap());
    assert_eq!(out, data);
}

/// A reference that fails at one offset, or panics there: the error (or the panic) reaches
/// the caller on every pool size, and nothing waits forever for the failed unit.
#[test]
fn pipeline_reports_a_failing_unit() {
    struct Failing {
        at: usize,
        panics: bool,
    }
    impl crate::codec::chunk::GroupedReference for Failing {
        fn grouped(&self, offset: usize, grouped: &mut [u8]) -> Result<()> {
            if (offset..offset + grouped.len()).contains(&self.at) {
                assert!(!self.panics, "test panic at {offset}");
                return Err(Error::Corrupt(format!("reference unreadable at {offset}")));
            }
            grouped.fill(0);
            Ok(())
        }
    }
    for panics in [false, true] {
        for threads in [1, 2, 4] {
            // A thread of its own, not a scoped one, so a hang fails the test instead of
            // hanging it.
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let data = sample();
                let failing = Failing { at: 150_000, panics };
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    pool.install(|| {
                        let options = Options { chunk_size: 4 << 10, ..Options::default() };
                        let mut w =
                            ContainerWriter::new(Vec::new(), FileKind::Bytes, data.len() as u64, options).unwrap();
                        let reference = Some(Reference::Grouped { source: &failing, offset: 0, len: data.len() });
                        let input = SegmentInput {
                            data: Data::Bytes(&data),
                            dtype: Some(Dtype::Bf16),
                            reference,
                            link: None,
                            row_len: None,
                        };
                        w.segment_inputs(&[input], &mut |_| {}).map_err(|e| e.to_string())
                    })
                }));
                done_tx.send(outcome.map_err(|_| "panicked")).unwrap();
            });
            let outcome = done_rx.recv_timeout(std::time::Duration::from_secs(60)).expect("no hang");
            match (panics, outcome) {
                (false, Ok(Err(e))) => assert!(e.contains("reference unreadable at 147456"), "{e}"),
                (true, Err(_)) => {}
                (_, other) => panic!("threads {threads}, panics {panics}: {other:?}"),
            }
        }
    }
}

#[test]
fn delta_round_trip() {
    let data = sample();
    let mut next = data.clone();
    for (i, b) in next.iter_mut().enumerate() {
        if i % 13 == 0 {
            *b ^= 0x01;
        }
    }
    let options = Options { chunk_size: 16 << 10, ..Options::default() };
    let mut w = ContainerWriter::new(Vec::new(), FileKind::Bytes, next.len() as u64, options).unwrap();
    w.segment_delta(&next, Some(&data), Some(Dtype::Bf16)).unwrap();
    let bytes = w.finish().unwrap().0;
    assert!(bytes.len() < next.len() / 4, "a sparse delta is small: {}", bytes.len());
    let c = Container::open(&bytes).unwrap();
    let mut out = Vec::new();
    c.decode_to_with_reference(Some(&data), &mut out).unwrap();
    assert_eq!(out, next);
    assert!(c.decode_to(&mut Vec::new()).is_err(), "without the reference the hash cannot match");
}

/// Containers of format 1 (whole-element rotation) and chunk sizes that are not powers of
/// two are refused with a message saying why, before anything is decoded.
#[test]
fn old_versions_and_bad_chunk_sizes_are_refused() {
    let bytes = build(&sample());
    let mut old = bytes.clone();
    old[8..10].copy_from_slice(&1u16.to_le_bytes());
    let err = Container::open(&old).err().expect("format 1 refused").to_string();
    assert!(err.contains("container format version 1, this ckpt reads 2 to 7"), "{err}");
    let mut newer = bytes.clone();
    newer[8..10].copy_from_slice(&8u16.to_le_bytes());
    let err = Container::open(&newer).err().expect("format 8 refused").to_string();
    assert!(err.contains("container format version 8, this ckpt reads 2 to 7"), "{err}");
    // A format-2 container (format 3 only added a method tag) still opens and decodes.
    let mut format2 = bytes.clone();
    format2[8..10].copy_from_slice(&2u16.to_le_bytes());
    let n = format2.len();
    let index_offset = read_u64(&format2[n - FOOTER_LEN..], 0).unwrap() as usize;
    let sum =
        checksum(&format2[..HEADER_LEN], &format2[index_offset..n - FOOTER_LEN], &format2[n - FOOTER_LEN..n - 16]);
    format2[n - 16..n - 8].copy_from_slice(&sum);
    let mut out = Vec::new();
    Container::open(&format2).expect("format 2 opens").decode_to(&mut out).unwrap();
    assert_eq!(out, sample());
    let mut odd = bytes.clone();
    odd[12..16].copy_from_slice(&(12u32 << 10).to_le_bytes());
    let err = Container::open(&odd).err().expect("12 KiB chunks refused").to_string();
    assert!(err.contains("chunk size 12288"), "{err}");
    let options = Options { chunk_size: 12 << 10, ..Options::default() };
    let err = ContainerWriter::new(Vec::new(), FileKind::Bytes, 0, options).err().expect("writer refuses").to_string();
    assert!(err.contains("chunk size 12288 is not a power of two"), "{err}");
}

#[test]
fn truncations_are_errors() {
    let data = sample();
    let bytes = build(&data);
    for cut in [0, 1, 8, 31, 32, 95, 96, bytes.len() / 2, bytes.len() - 1] {
        assert!(Container::open(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}
