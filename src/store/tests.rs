use super::*;
use crate::dtype::Dtype;
use rayon::prelude::*;

fn options() -> Options {
    Options { chunk_size: 4096, ..Options::default() }
}

/// bf16-looking bytes: noisy low bytes, a few distinct exponents.
fn weights(seed: u64, len: usize) -> Vec<u8> {
    crate::test_data::xorshift(seed)
        .take(len)
        .enumerate()
        .map(|(i, s)| if i % 2 == 1 { 0x3C + (s % 3) as u8 } else { s as u8 })
        .collect()
}

/// `base` with every `every`-th byte's low bit flipped.
fn drift(base: &[u8], every: usize) -> Vec<u8> {
    base.iter().enumerate().map(|(i, &b)| if i % every == 0 { b ^ 1 } else { b }).collect()
}

/// A new store holding `v0 = weights(seed, len)` as a standalone bf16 blob, and `v1`, a drift
/// of it, not stored: (dir, store, v0, v1, id0, id1).
fn store_with_base(
    seed: u64,
    len: usize,
    every: usize,
) -> (tempfile::TempDir, Store, Vec<u8>, Vec<u8>, ObjectId, ObjectId) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let v0 = weights(seed, len);
    let v1 = drift(&v0, every);
    let (id0, id1) = (ObjectId::hash(&v0), ObjectId::hash(&v1));
    store.write_blob(id0, &v0, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    (dir, store, v0, v1, id0, id1)
}

/// Feedback that gives (or not) the data's xxh3; a reverse-delta rewrite needs it.
fn with_xxh3(xxh3: Option<u64>) -> Feedback<'static> {
    Feedback { input_xxh3: xxh3, ..Feedback::NONE }
}

fn read(store: &Store, id: &ObjectId) -> Vec<u8> {
    let mut out = Vec::new();
    store.open_blob(id).unwrap().copy_to(&mut out).unwrap();
    out
}

#[test]
fn blob_round_trip_standalone_and_chain() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let v0 = weights(1, 50_001 * 2);
    let id0 = ObjectId::hash(&v0);
    let w0 = store.write_blob(id0, &v0, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    assert_eq!(w0.header.depth, 0);
    assert!(store.contains(&id0));
    assert_eq!(read(&store, &id0), v0);

    // A chain of three deltas, each against the previous.
    let mut previous = (id0, v0.clone());
    let mut versions = vec![previous.clone()];
    for n in 1..=3 {
        let next = drift(&previous.1, 7 + n);
        let id = ObjectId::hash(&next);
        let reference = store.open_blob(&previous.0).unwrap();
        let outcome = store.write_blob_delta(id, &next, &reference, u64::MAX, &options(), &Feedback::NONE).unwrap();
        let DeltaOutcome::Written(w) = outcome else { panic!("unlimited delta must be written") };
        assert_eq!(w.header.depth, n as u32);
        assert_eq!(w.header.reference, Some(previous.0));
        assert!(w.stored_len < reference.base_stored_len(), "{} vs {}", w.stored_len, reference.base_stored_len());
        previous = (id, next);
        versions.push(previous.clone());
    }
    for (id, bytes) in &versions {
        assert_eq!(&read(&store, id), bytes);
        store.verify(id).unwrap();
    }
    let chain = store.open_blob(&versions[3].0).unwrap();
    assert_eq!(chain.ids(), versions.iter().rev().map(|v| v.0).collect::<Vec<_>>());

    // A delta that does not pay is not stored.
    let unrelated = weights(99, v0.len());
    let uid = ObjectId::hash(&unrelated);
    let reference = store.open_blob(&id0).unwrap();
    let outcome = store.write_blob_delta(uid, &unrelated, &reference, 100, &options(), &Feedback::NONE).unwrap();
    assert!(matches!(outcome, DeltaOutcome::NotSmaller { .. }));
    assert!(!store.contains(&uid));
    assert_eq!(store.list().unwrap().len(), 4);
}

/// A blob stored as a delta on another decodes from that blob's grouped chunks alone
/// (`ChainDecoder::decode_over`), to the same bytes as through its chain; anything else is refused.
#[test]
fn a_delta_decodes_over_its_references_grouped_chunks() {
    let (_dir, store, v0, v1, id0, id1) = store_with_base(5, 40_000 * 2, 5);
    let reference = store.open_blob(&id0).unwrap();
    let outcome = store.write_blob_delta(id1, &v1, &reference, u64::MAX, &options(), &Feedback::NONE).unwrap();
    assert!(matches!(outcome, DeltaOutcome::Written(_)));
    let (top, base) = (store.open_blob(&id1).unwrap(), store.open_blob(&id0).unwrap());
    assert!(top.is_delta_on(&base) && !base.is_delta_on(&top));
    let (top_decoder, base_decoder) = (top.decoder().unwrap(), base.decoder().unwrap());
    let n = base_decoder.chunk_count();
    // Two pieces of chunks, as a report's windows read them.
    for chunks in [0..n / 2, n / 2..n] {
        let span = base_decoder.byte_range(chunks.clone());
        let (mut grouped, mut bytes) = (vec![0; span.len()], vec![0; span.len()]);
        base_decoder.decode_keeping_groups(chunks.clone(), &mut grouped, &mut bytes).unwrap();
        assert_eq!(bytes, v0[span.clone()]);
        let (mut top_grouped, mut top_bytes) = (vec![0; span.len()], vec![0; span.len()]);
        top_decoder.decode_over(&grouped, chunks.clone(), &mut top_grouped, &mut top_bytes).unwrap();
        assert_eq!(top_bytes, v1[span.clone()]);
        let mut whole = vec![0; span.len()];
        top_decoder.decode_keeping_groups(chunks.clone(), &mut vec![0; span.len()], &mut whole).unwrap();
        assert_eq!(whole, top_bytes);
        // A standalone blob is a delta on nothing; a reference of the wrong length is refused.
        assert!(base_decoder.decode_over(&grouped, chunks.clone(), &mut top_grouped, &mut top_bytes).is_err());
        assert!(top_decoder.decode_over(&grouped[1..], chunks, &mut top_grouped, &mut top_bytes).is_err());
    }
}

#[test]
fn data_objects_and_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let w = store.write_data(ObjectKind::Version, b"{\"a\":1}", &options()).unwrap();
    assert_eq!(w.id, ObjectId::hash(b"{\"a\":1}"));
    assert_eq!(store.read_data(&w.id, ObjectKind::Version).unwrap(), b"{\"a\":1}");
    assert!(matches!(store.read_data(&w.id, ObjectKind::Manifest), Err(Error::WrongKind { .. })));
    assert!(matches!(store.open_blob(&w.id), Err(Error::WrongKind { .. })));
    let missing = ObjectId::hash(b"nothing");
    assert!(matches!(store.read_data(&missing, ObjectKind::Version), Err(Error::Missing { .. })));
    // Empty blob.
    let empty = ObjectId::hash(b"");
    store.write_blob(empty, b"", Some(Dtype::F32), &options(), &Feedback::NONE).unwrap();
    assert_eq!(read(&store, &empty), b"");
    store.verify(&empty).unwrap();
}

#[test]
fn a_changed_byte_anywhere_is_detected_and_named() {
    let (_dir, store, _, v1, id0, id1) = store_with_base(3, 20_000, 5);
    let reference = store.open_blob(&id0).unwrap();
    store.write_blob_delta(id1, &v1, &reference, u64::MAX, &options(), &Feedback::NONE).unwrap();
    drop(reference);
    for id in [id0, id1] {
        let path = store.object_path(&id);
        let good = std::fs::read(&path).unwrap();
        let step = (good.len() / 300).max(1);
        for at in (0..good.len()).step_by(step).chain([good.len() - 1]) {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            std::fs::write(&path, &bad).unwrap();
            // Reading the delta (which decodes through the base) must fail as well.
            for target in [id0, id1] {
                let mut out = Vec::new();
                let result = store.open_blob(&target).and_then(|c| c.copy_to(&mut out));
                if target == id0 && id == id1 {
                    assert!(result.is_ok());
                    continue;
                }
                let err = result.expect_err(&format!("flip at {at} of {id:?} read through {target:?}"));
                let text = err.to_string();
                assert!(
                    text.contains(&id.to_hex()) || text.contains(&target.to_hex()),
                    "error names the object: {text}"
                );
            }
            assert!(store.verify(&id).is_err());
        }
        std::fs::write(&path, &good).unwrap();
    }
    // Truncation and a missing reference.
    let path = store.object_path(&id0);
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    assert!(store.verify(&id0).is_err());
    std::fs::remove_file(&path).unwrap();
    let err = store.open_blob(&id1).err().unwrap();
    assert!(matches!(err, Error::Corrupt { id, .. } if id == id1), "{err}");
}

/// Commit's fallback depends on this: coding a delta against a reference whose payload is
/// damaged fails with `Corrupt` naming the reference (not the new blob), and stores nothing.
#[test]
fn a_delta_against_a_damaged_reference_names_it_and_stores_nothing() {
    let (_dir, store, _, v1, id0, id1) = store_with_base(5, 64_000, 3);
    let path = store.object_path(&id0);
    let mut bytes = std::fs::read(&path).unwrap();
    // A byte in the middle of the payloads: header, index and footer still check out.
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let reference = store.open_blob(&id0).unwrap();
    let err = store.write_blob_delta(id1, &v1, &reference, u64::MAX, &options(), &Feedback::NONE).unwrap_err();
    assert!(matches!(&err, Error::Corrupt { id, .. } if *id == id0), "{err}");
    assert!(!store.contains(&id1));
}

/// Data that is not what the caller hashed (a file rewritten between hashing and coding) fails
/// the write with `ChangedWhileWriting` and stores nothing: caught by blake3 when the caller
/// gives only the id, by xxh3 when it gives the checksum too, standalone and delta alike.
#[test]
fn data_that_changed_after_hashing_is_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let v0 = weights(8, 40_000);
    let v1 = drift(&v0, 9);
    let id0 = ObjectId::hash(&v0);
    let xxh3 = |d: &[u8]| xxhash_rust::xxh3::xxh3_64(d);
    let changed = |r: Result<Written>| matches!(r, Err(Error::ChangedWhileWriting { id }) if id == id0);
    // v1 arrives where v0 was hashed.
    assert!(changed(store.write_blob(id0, &v1, Some(Dtype::Bf16), &options(), &with_xxh3(None))));
    assert!(changed(store.write_blob(id0, &v1, Some(Dtype::Bf16), &options(), &with_xxh3(Some(xxh3(&v0))))));
    assert!(!store.contains(&id0));
    // The right checksum stores, and the recorded id checks out on reading.
    store.write_blob(id0, &v0, Some(Dtype::Bf16), &options(), &with_xxh3(Some(xxh3(&v0)))).unwrap();
    assert_eq!(read(&store, &id0), v0);
    let reference = store.open_blob(&id0).unwrap();
    let id2 = ObjectId::hash(&drift(&v0, 4));
    let delta =
        store.write_blob_delta(id2, &v1, &reference, u64::MAX, &options(), &with_xxh3(Some(xxh3(&drift(&v0, 4)))));
    assert!(matches!(delta, Err(Error::ChangedWhileWriting { id }) if id == id2), "{delta:?}");
    assert!(!store.contains(&id2));
}

#[test]
fn list_remove_and_tmp() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let ids: Vec<ObjectId> =
        (0..5u8).map(|i| store.write_data(ObjectKind::Manifest, &[i; 10], &options()).unwrap().id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(store.list().unwrap(), sorted);
    std::fs::write(dir.path().join("objects").join("stray"), b"x").unwrap();
    std::fs::write(dir.path().join("tmp").join("obj-leftover"), b"x").unwrap();
    assert_eq!(store.list().unwrap().len(), 5);
    store.remove(&ids[0]).unwrap();
    store.remove(&ids[0]).unwrap();
    assert_eq!(store.list().unwrap().len(), 4);
    assert_eq!(store.clean_tmp(std::time::Duration::from_secs(60)).unwrap(), 0, "a young temp file may be a writer's");
    assert_eq!(store.clean_tmp(std::time::Duration::ZERO).unwrap(), 1);
}

#[test]
fn background_sync_makes_every_object_visible_by_its_return() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    // More objects than the queue holds, so writers also wait for the syncing threads.
    let contents: Vec<Vec<u8>> = (0..SYNC_QUEUE as u64 + 40).map(|i| weights(i, 3000 + i as usize)).collect();
    let ids = store
        .with_background_sync(|view| {
            contents
                .par_iter()
                .map(|c| view.write_data(ObjectKind::Version, c, &options()).map(|w| w.id))
                .collect::<Result<Vec<_>>>()
        })
        .unwrap();
    for (id, c) in ids.iter().zip(&contents) {
        assert_eq!(store.read_data(id, ObjectKind::Version).unwrap(), *c);
    }
    assert_eq!(store.list().unwrap().len(), contents.len());
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "no temp file left");
}

#[test]
fn background_sync_reports_a_failed_sync_and_the_callers_error_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path()).unwrap();
    let (good, bad) = (b"stored fine".to_vec(), b"cannot be moved into place".to_vec());
    // A file where the bad object's fan-out directory must go makes its rename fail.
    let bad_id = ObjectId::hash(&bad);
    let blocker = store.object_path(&bad_id).parent().unwrap().to_path_buf();
    std::fs::write(&blocker, b"in the way").unwrap();
    let err = store
        .with_background_sync(|view| {
            view.write_data(ObjectKind::Version, &good, &options())?;
            view.write_data(ObjectKind::Version, &bad, &options())
        })
        .unwrap_err();
    assert!(matches!(err, Error::Io { ref path, .. } if path.starts_with(&blocker)), "{err}");
    assert!(store.contains(&ObjectId::hash(&good)));
    assert!(!store.contains(&bad_id));

    // The caller's own error wins over a sync error.
    let err = store
        .with_background_sync(|view| {
            view.write_data(ObjectKind::Version, &bad, &options())?;
            Err::<(), _>(Error::Missing { id: bad_id })
        })
        .unwrap_err();
    assert!(matches!(err, Error::Missing { .. }), "{err}");
}

/// Reverse deltas: a standalone blob rewritten against a newer standalone one reads back the
/// same through it, chains through the old blob get one level deeper, and the rewrite refuses
/// blobs that are not standalone or do not match.
#[test]
fn standalone_blob_is_rewritten_as_a_delta_against_a_newer_one() {
    let (_dir, store, v0, v1, id0, id1) = store_with_base(5, 40_000, 11);
    // An older delta on top of v0: a chain that goes through the blob being rewritten.
    let before = drift(&v0, 13);
    let id_before = ObjectId::hash(&before);
    let chain0 = store.open_blob(&id0).unwrap();
    let DeltaOutcome::Written(_) =
        store.write_blob_delta(id_before, &before, &chain0, u64::MAX, &options(), &Feedback::NONE).unwrap()
    else {
        panic!("delta written")
    };
    store.write_blob(id1, &v1, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let chain1 = store.open_blob(&id1).unwrap();

    let outcome = store.rewrite_as_delta_against(&chain0, &chain1, u64::MAX, &options(), &|_| {}).unwrap();
    let DeltaOutcome::Written(w) = outcome else { panic!("a small drift pays") };
    assert_eq!((w.id, w.header.reference, w.header.depth), (id0, Some(id1), 1));
    assert!(w.stored_len < chain0.stored_len(), "{} vs {}", w.stored_len, chain0.stored_len());
    drop(chain0);
    assert_eq!(read(&store, &id0), v0);
    assert_eq!(read(&store, &id1), v1);
    assert_eq!(read(&store, &id_before), before);
    assert_eq!(store.open_blob(&id_before).unwrap().depth(), 2);
    assert_eq!(store.chain_depth(&id_before).unwrap(), 2);
    assert_eq!(store.header(&id_before).unwrap().depth, 1, "the header keeps its written depth");
    for id in [id0, id1, id_before] {
        store.verify(&id).unwrap();
    }

    // id0 is a delta now: it cannot be rewritten again, nor can anything against a delta, nor
    // a blob against itself. Each refusal names the object and why, and changes nothing.
    let message = |r: Result<DeltaOutcome>| r.expect_err("refused").to_string();
    let chain0 = store.open_blob(&id0).unwrap();
    let err = message(store.rewrite_as_delta_against(&chain0, &chain1, u64::MAX, &options(), &|_| {}));
    assert!(err.contains(&format!("{id0} is not stored standalone")), "{err}");
    let err = message(store.rewrite_as_delta_against(&chain1, &chain0, u64::MAX, &options(), &|_| {}));
    assert!(err.contains(&format!("{id0} is not stored standalone")), "{err}");
    let err = message(store.rewrite_as_delta_against(&chain1, &chain1, u64::MAX, &options(), &|_| {}));
    assert!(err.contains(&format!("{id1} against itself")), "{err}");
    assert_eq!(store.header(&id1).unwrap().reference, None);
    assert_eq!(read(&store, &id1), v1);
    // Blobs of other lengths do not pair.
    let short = weights(3, v1.len() - 2);
    let short_id = ObjectId::hash(&short);
    store.write_blob(short_id, &short, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let short_chain = store.open_blob(&short_id).unwrap();
    let err = message(store.rewrite_as_delta_against(&chain1, &short_chain, u64::MAX, &options(), &|_| {}));
    assert!(err.contains(&format!("{} bytes against {}", short.len(), v1.len())), "{err}");
}

/// A damaged newer blob fails the rewrite with an error naming it, and the older blob stays as
/// it was: nothing is written from bytes that do not check out.
#[test]
fn rewrite_against_a_damaged_blob_names_it_and_keeps_the_older() {
    let (_dir, store, v0, v1, id0, id1) = store_with_base(8, 30_000, 11);
    store.write_blob(id1, &v1, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let path1 = store.object_path(&id1);
    let mut bytes = std::fs::read(&path1).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path1, &bytes).unwrap();
    let before = std::fs::read(store.object_path(&id0)).unwrap();
    let (chain0, chain1) = (store.open_blob(&id0).unwrap(), store.open_blob(&id1).unwrap());
    let err = store.rewrite_as_delta_against(&chain0, &chain1, u64::MAX, &options(), &|_| {}).unwrap_err();
    assert!(matches!(err, Error::Corrupt { id, .. } if id == id1), "{err:?}");
    assert_eq!(std::fs::read(store.object_path(&id0)).unwrap(), before);
    assert_eq!(read(&store, &id0), v0);
}

/// A rewrite that does not pay leaves the old object as it was.
#[test]
fn rewrite_that_does_not_pay_keeps_the_standalone_blob() {
    let (_dir, store, v0, _, id0, _) = store_with_base(6, 30_000, 11);
    let unrelated = weights(77, v0.len());
    let uid = ObjectId::hash(&unrelated);
    store.write_blob(uid, &unrelated, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let chain0 = store.open_blob(&id0).unwrap();
    let unrelated_chain = store.open_blob(&uid).unwrap();
    let before = std::fs::read(store.object_path(&id0)).unwrap();
    let outcome = store.rewrite_as_delta_against(&chain0, &unrelated_chain, u64::MAX, &options(), &|_| {});
    assert!(matches!(outcome, Ok(DeltaOutcome::NotSmaller { .. })), "{outcome:?}");
    assert_eq!(std::fs::read(store.object_path(&id0)).unwrap(), before);
}

/// Headers no longer have to agree on depth, so a damaged store whose references form a cycle
/// is stopped by the chain length bound: every reader fails with an error naming the chain, and
/// none loops.
#[test]
fn reference_cycle_is_an_error_not_a_hang() {
    let (_dir, store, v0, v1, id0, id1) = store_with_base(8, 20_000, 11);
    let chain0 = store.open_blob(&id0).unwrap();
    let DeltaOutcome::Written(_) =
        store.write_blob_delta(id1, &v1, &chain0, u64::MAX, &options(), &Feedback::NONE).unwrap()
    else {
        panic!("delta written")
    };
    drop(chain0);
    // Replace v0's object by a delta against v1, which is a delta against v0.
    let chain1 = store.open_blob(&id1).unwrap();
    let DeltaOutcome::Written(_) =
        store.write_blob_delta(id0, &v0, &chain1, u64::MAX, &options(), &Feedback::NONE).unwrap()
    else {
        panic!("delta written")
    };
    drop(chain1);
    for id in [id0, id1] {
        let err = store.open_blob(&id).err().expect("a cycle does not open");
        assert!(err.to_string().contains("delta chain too long"), "{err}");
        assert!(store.chain_depth(&id).is_err());
        assert!(store.verify(&id).is_err());
    }
}

#[test]
fn delta_for_transfer_is_imported_by_a_store_holding_the_reference() {
    // Here: v1 standalone, v0 rewritten as a reverse delta against it (the newest is whole).
    let (_dir, store, v0, v1, id0, id1) = store_with_base(21, 40_000, 7);
    store.write_blob(id1, &v1, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let (chain0, chain1) = (store.open_blob(&id0).unwrap(), store.open_blob(&id1).unwrap());
    store.rewrite_as_delta_against(&chain0, &chain1, u64::MAX, &options(), &|_| {}).unwrap();
    let (chain0, chain1) = (store.open_blob(&id0).unwrap(), store.open_blob(&id1).unwrap());
    assert_eq!(chain0.depth(), 1);

    // There: v0 standalone. v1 goes over as a delta against v0, built from the reverse form.
    let (tmp, len) =
        store.encode_delta_for_transfer(&chain1, &chain0, 1, u64::MAX, &options()).unwrap().expect("smaller");
    assert!(len < chain1.stored_len() / 2, "{len} bytes for a delta of a {} byte blob", chain1.stored_len());
    assert!(!store.object_path(&id1).starts_with(tmp.path()), "not stored here");
    assert_eq!(read(&store, &id1), v1, "this store is unchanged");
    let there_dir = tempfile::tempdir().unwrap();
    let there = Store::init(there_dir.path()).unwrap();
    there.write_blob(id0, &v0, Some(Dtype::Bf16), &options(), &Feedback::NONE).unwrap();
    let received = there.receive_file().unwrap();
    std::fs::copy(tmp.path(), received.path()).unwrap();
    let written = there.import(&id1, Some(ObjectKind::Blob), received).unwrap();
    assert_eq!(written.header.reference, Some(id0));
    assert_eq!(read(&there, &id1), v1);

    // A limit it does not fit under, and pairs it refuses.
    assert!(store.encode_delta_for_transfer(&chain1, &chain0, 1, 100, &options()).unwrap().is_none());
    let err = store.encode_delta_for_transfer(&chain1, &chain1, 1, u64::MAX, &options()).err().unwrap();
    assert!(err.to_string().contains("against itself"), "{err}");
    let err = store.encode_delta_for_transfer(&chain1, &chain0, 0, u64::MAX, &options()).err().unwrap();
    assert!(err.to_string().contains("depth 0"), "{err}");
}
