//! Tests on checkpoints written by real torch.distributed ranks (tests/fixtures/dcp/, see
//! make_fixtures.py there) and on damaged or hostile variants of them.

use super::*;
use serde_json::Value as Json;

macro_rules! fixture {
    ($dir:literal, [$($file:literal),*]) => {
        Fixture {
            metadata: include_bytes!(concat!("../../../tests/fixtures/dcp/", $dir, "/.metadata")),
            files: &[$(($file, include_bytes!(concat!("../../../tests/fixtures/dcp/", $dir, "/", $file)))),*],
            expected: include_str!(concat!("../../../tests/fixtures/dcp/", $dir, ".expected.json")),
        }
    };
}

struct Fixture {
    metadata: &'static [u8],
    files: &'static [(&'static str, &'static [u8])],
    expected: &'static str,
}

impl Fixture {
    fn expected(&self) -> Json {
        serde_json::from_str(self.expected).expect("expected.json")
    }
    fn file(&self, name: &str) -> &'static [u8] {
        self.files.iter().find(|(n, _)| *n == name).map(|(_, b)| *b).expect("fixture file")
    }
}

fn epoch1() -> Fixture {
    fixture!("mlp_2ranks_epoch1", ["__0_0.distcp", "__1_0.distcp"])
}
fn epoch2() -> Fixture {
    fixture!("mlp_2ranks_epoch2", ["__0_0.distcp", "__1_0.distcp"])
}
fn four_ranks() -> Fixture {
    fixture!("mlp_4ranks_epoch2", ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"])
}
fn objects() -> Fixture {
    fixture!("objects_2ranks", ["__0_0.distcp", "__1_0.distcp"])
}

/// FNV-1a 64, as make_fixtures.py hashes each shard's raw bytes.
fn fnv1a64(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{h:016x}")
}

fn u64s(v: &Json) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("u64")).collect()
}

/// The name make_fixtures.py's item would get.
fn expected_name(t: &Json) -> String {
    let dims: Vec<String> =
        u64s(&t["offsets"]).iter().zip(u64s(&t["sizes"])).map(|(o, s)| format!("{o}:{}", o + s)).collect();
    format!("{}[{}]", t["fqn"].as_str().expect("fqn"), dims.join(","))
}

/// Every storage of every file, by name: (dtype, shape, bytes).
fn storages(f: &Fixture, metadata: &Metadata) -> HashMap<String, (Dtype, Vec<u64>, &'static [u8])> {
    let mut out = HashMap::new();
    for (name, bytes) in f.files {
        let found = file_items(bytes, metadata, name).expect("found");
        check_cover(bytes, &found);
        for s in found.items.iter().flat_map(|i| &i.storages) {
            let previous = out.insert(
                s.name.clone(),
                (s.dtype, s.shape.clone(), &bytes[s.range.start as usize..s.range.end as usize]),
            );
            assert!(previous.is_none(), "{} twice", s.name);
        }
    }
    out
}

/// Items in order and disjoint, segments covering the file exactly once, storages inside their
/// items with byte lengths matching dtype and shape.
fn check_cover(file: &[u8], found: &FileItems) {
    assert_eq!(found.len, file.len() as u64);
    let mut at = 0;
    for item in &found.items {
        assert!(item.range.start >= at, "{}", item.name);
        for s in &item.storages {
            assert!(item.range.start <= s.range.start && s.range.end <= item.range.end, "{}", s.name);
        }
        at = item.range.end;
    }
    let mut at = 0;
    for (range, storage) in found.segments() {
        assert_eq!(range.start, at);
        match storage {
            Some(s) => {
                let elements: u64 = s.shape.iter().product();
                assert_eq!(range.end - range.start, elements * s.dtype.size() as u64, "{}", s.name);
            }
            None => assert!(range.end > range.start),
        }
        at = range.end;
    }
    assert_eq!(at, file.len() as u64);
}

/// Every shard torch wrote is found, named by fqn and chunk, with torch's dtype, shape and bytes.
fn check_fixture(f: &Fixture) {
    let expected = f.expected();
    assert!(expected["torch_version"].as_str().expect("version").starts_with("2."));
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let tensors = expected["tensors"].as_array().expect("tensors");
    let objects = expected["objects"].as_object().expect("objects");
    assert_eq!(metadata.items.len(), tensors.len() + objects.len());
    let found = storages(f, &metadata);
    assert_eq!(found.len(), tensors.len());
    for t in tensors {
        let name = expected_name(t);
        let (dtype, shape, bytes) = found.get(&name).unwrap_or_else(|| panic!("{name} not found"));
        assert_eq!(Some(*dtype), dtype_of_torch(t["dtype"].as_str().expect("dtype")), "{name}");
        assert_eq!(*shape, u64s(&t["sizes"]), "{name}");
        assert_eq!(fnv1a64(bytes), t["fnv1a64"].as_str().expect("hash"), "{name}");
    }
    for fqn in objects.keys() {
        let item = metadata.items.iter().find(|i| &i.fqn == fqn).unwrap_or_else(|| panic!("{fqn}"));
        assert_eq!(item.kind, ItemKind::Bytes);
        assert_eq!(item.name(), *fqn);
    }
    // Every item is understood (none opaque), and walking the archives without `.metadata`
    // finds the same items and the same tensor bytes.
    for (name, bytes) in f.files {
        let found = file_items(bytes, &metadata, name).expect("found");
        assert!(found.items.iter().all(|i| i.opaque.is_none()), "{name}");
        let walked = walk_archives(bytes).expect("walk");
        check_cover(bytes, &walked);
        let ranges = |l: &FileItems| l.items.iter().map(|i| i.range.clone()).collect::<Vec<_>>();
        assert_eq!(ranges(&walked), ranges(&found), "{name}");
        let payloads =
            |l: &FileItems| l.storage_map().storages.iter().map(|s| (s.range.clone(), s.dtype)).collect::<Vec<_>>();
        assert_eq!(payloads(&walked), payloads(&found), "{name}");
    }
}

#[test]
fn two_ranks_every_shard_is_found_with_torchs_bytes() {
    check_fixture(&epoch1());
    check_fixture(&epoch2());
}

#[test]
fn four_ranks_every_shard_is_found_including_empty_ones() {
    let f = four_ranks();
    check_fixture(&f);
    // fc2 has 6 rows: on 4 ranks the last shard is empty, and DCP still writes it.
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let found = storages(&f, &metadata);
    let (_, shape, bytes) = &found["model.fc2.weight[6:6,0:32]"];
    assert_eq!((shape.as_slice(), bytes.len()), (&[0, 32][..], 0));
}

#[test]
fn non_tensor_values_are_bytes_items() {
    let f = objects();
    check_fixture(&f);
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let step = metadata.items.iter().find(|i| i.fqn == "step").expect("step");
    let found = file_items(f.file(&step.file), &metadata, &step.file).expect("found");
    let item = found.items.iter().find(|i| i.name == "step").expect("step item");
    assert!(item.storages.is_empty() && item.opaque.is_none());
}

#[test]
fn successive_saves_name_their_items_alike() {
    let names = |f: &Fixture| {
        let mut n: Vec<(String, String)> =
            parse_metadata(f.metadata).expect("metadata").items.iter().map(|i| (i.name(), i.file.clone())).collect();
        n.sort();
        n
    };
    assert_eq!(names(&epoch1()), names(&epoch2()));
    // The epochs differ, but only a little: same sizes, other bytes.
    let (e1, e2) = (epoch1(), epoch2());
    let (m1, m2) = (parse_metadata(e1.metadata).expect("1"), parse_metadata(e2.metadata).expect("2"));
    let (s1, s2) = (storages(&e1, &m1), storages(&e2, &m2));
    let w = "model.fc1.weight[0:16,0:8]";
    assert_eq!(s1[w].2.len(), s2[w].2.len());
    assert_ne!(s1[w].2, s2[w].2);
}

#[test]
fn dim0_shards_of_four_ranks_are_byte_ranges_of_the_two_rank_shards() {
    // After a change of rank count the names differ (`[0:8,..]` and `[8:16,..]` against
    // `[0:16,..]`), but a shard on dim 0 is a contiguous row range of the whole tensor.
    let (two, four) = (epoch2(), four_ranks());
    let s2 = storages(&two, &parse_metadata(two.metadata).expect("2"));
    let s4 = storages(&four, &parse_metadata(four.metadata).expect("4"));
    for fqn in ["model.fc1.weight", "optim.fc1.weight.exp_avg"] {
        let whole = s2[&format!("{fqn}[0:16,0:8]")].2;
        let halves = [s4[&format!("{fqn}[0:8,0:8]")].2, s4[&format!("{fqn}[8:16,0:8]")].2].concat();
        assert_eq!(whole, &halves[..], "{fqn}");
    }
}

/// Every storage of every file cut with cells of at least `cell_min` bytes, by name.
fn cells(f: &Fixture, cell_min: u64) -> HashMap<String, (Vec<u64>, &'static [u8])> {
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let mut out = HashMap::new();
    for (name, bytes) in f.files {
        let found = file_items_cells(bytes, &metadata, name, cell_min).expect("found");
        check_cover(bytes, &found);
        for s in found.items.iter().flat_map(|i| &i.storages) {
            let previous =
                out.insert(s.name.clone(), (s.shape.clone(), &bytes[s.range.start as usize..s.range.end as usize]));
            assert!(previous.is_none(), "{} twice", s.name);
        }
    }
    out
}

#[test]
fn cells_give_two_and_four_ranks_the_same_names_and_bytes() {
    // With cells of 32 bytes the fixtures' small tensors are cut as large ones are with
    // `CELL_MIN_BYTES`: `embed` (16 x 8 f32) and `fc1` (32 x 8 f32) into rows, at every rank count.
    let (two, four) = (cells(&epoch2(), 32), cells(&four_ranks(), 32));
    for fqn in ["model.embed.weight", "model.fc1.weight", "optim.fc1.weight.exp_avg", "optim.fc1.weight.exp_avg_sq"] {
        let of = |c: &HashMap<String, (Vec<u64>, &[u8])>| {
            let mut v: Vec<(String, Vec<u64>, Vec<u8>)> = c
                .iter()
                .filter(|(n, _)| n.starts_with(&format!("{fqn}[")))
                .map(|(n, (shape, bytes))| (n.clone(), shape.clone(), bytes.to_vec()))
                .collect();
            v.sort();
            v
        };
        let (a, b) = (of(&two), of(&four));
        assert!(a.len() >= 8, "{fqn}: {} cells", a.len());
        assert_eq!(a, b, "{fqn}: the same cells, under the same names, with the same bytes");
    }
    // Uneven shards (fc2: 6 rows, 3 + 3 on two ranks, 2 + 2 + 2 + 0 on four) share what lines up.
    let shared = two.keys().filter(|n| n.starts_with("model.fc2.weight[") && four.contains_key(*n)).count();
    assert!(shared < two.keys().filter(|n| n.starts_with("model.fc2.weight[")).count());
    for (name, (_, bytes)) in two.iter().filter(|(n, _)| four.contains_key(*n)) {
        assert_eq!(*bytes, four[name].1, "{name}");
    }
    // The default cell size leaves these small tensors whole: the items' own names.
    let whole = storages(&epoch2(), &parse_metadata(epoch2().metadata).expect("2"));
    assert!(whole.contains_key("model.fc1.weight[0:16,0:8]"));
}

#[test]
fn cell_rows_follow_the_grid_of_the_whole_tensor() {
    const MIB: u64 = 1 << 20;
    // 1024 x 4096 f32 = 16 MiB: four cells of 4 MiB (256 rows).
    let t = [1024, 4096];
    assert_eq!(cell_rows(&t, &[0, 0], &[1024, 4096], 4), vec![0..256, 256..512, 512..768, 768..1024]);
    assert_eq!(cell_rows(&t, &[512, 0], &[512, 4096], 4), vec![512..768, 768..1024]);
    assert_eq!(cell_rows(&t, &[256, 0], &[256, 4096], 4), vec![256..512]);
    // A chunk off the grid (3 ranks: 342 rows) is cut where the grid crosses it.
    assert_eq!(cell_rows(&t, &[0, 0], &[342, 4096], 4), vec![0..256, 256..342]);
    assert_eq!(cell_rows(&t, &[342, 0], &[342, 4096], 4), vec![342..684]);
    // An uneven shard across the one boundary of two cells holds no whole cell: whole.
    assert_eq!(cell_rows(&[30522, 384], &[7631, 0], &[7631, 384], 4), vec![7631..15262]);
    assert_eq!(cell_rows(&[30522, 384], &[0, 0], &[15261, 384], 4), vec![0..15261]);
    // Narrower than the tensor in dim 1: its cells would be 1 MiB, so it stays whole.
    assert_eq!(cell_rows(&t, &[0, 0], &[512, 1024], 4), vec![0..512]);
    // Small tensors, rows no power of two divides, empty chunks: whole.
    assert_eq!(cell_rows(&[1024, 1024], &[0, 0], &[1024, 1024], 4), vec![0..1024]);
    assert_eq!(cell_rows(&[30521, 4096], &[0, 0], &[30521, 4096], 4), vec![0..30521]);
    assert_eq!(cell_rows(&t, &[1024, 0], &[0, 4096], 4), vec![1024..1024]);
    assert!(cell_rows(&[], &[], &[], 4).is_empty());
    // Never more than MAX_CELLS cells: 2^20 x 2^20 bytes would make 2^20 cells of 1 MiB rows.
    let huge = cell_rows(&[1 << 20, 1 << 20], &[0, 0], &[1 << 20, 1 << 20], 1);
    assert_eq!(huge.len() as u64, MAX_CELLS);
    assert!(huge.iter().all(|r| (r.end - r.start) << 20 >= 4 * MIB));
    // Overflowing shapes, chunks outside their tensor and mismatched ranks are left whole,
    // never a panic nor a long loop.
    assert_eq!(cell_rows(&[u64::MAX, u64::MAX], &[0, 0], &[u64::MAX, u64::MAX], 8), vec![0..u64::MAX]);
    assert_eq!(cell_rows(&t, &[0], &[1024, 4096], 4).len(), 1);
    assert_eq!(cell_rows(&t, &[0, 0], &[u64::MAX, 4096], 4), vec![0..u64::MAX]);
    assert_eq!(cell_rows(&t, &[512, 0], &[1024, 4096], 4), vec![512..1536]);
    assert_eq!(cell_rows(&[u64::MAX - 63, 1 << 20], &[u64::MAX - 64 - (1 << 20), 0], &[1 << 20, 1 << 20], 1).len(), 1);
    let near_max = cell_rows(&[1 << 63, 1], &[(1 << 63) - (1 << 58), 0], &[1 << 58, 1], 1);
    assert_eq!(near_max.len(), 2);
    assert_eq!(near_max.last().map(|r| r.end), Some(1 << 63));
}

proptest::proptest! {
    #[test]
    fn cell_rows_cover_the_chunk_with_few_large_cells(
        rows in 1u64..1 << 24,
        row_bytes in 1u64..1 << 16,
        start_frac in 0.0f64..1.0,
        len_frac in 0.0f64..1.0,
    ) {
        let start = ((rows as f64) * start_frac) as u64;
        let len = (((rows - start) as f64) * len_frac) as u64;
        let cells = cell_rows(&[rows, row_bytes], &[start, 0], &[len, row_bytes], 1);
        proptest::prop_assert_eq!(cells.first().map(|r| r.start), Some(start));
        proptest::prop_assert_eq!(cells.last().map(|r| r.end), Some(start + len));
        proptest::prop_assert!(cells.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
        proptest::prop_assert!(cells.len() as u64 <= MAX_CELLS + 1);
        // Every cell but the first and last is a whole cell of at least CELL_MIN_BYTES, and a
        // cut chunk holds one at least.
        if cells.len() > 1 {
            let longest = cells.iter().map(|r| r.end - r.start).max().unwrap_or(0);
            proptest::prop_assert!(longest * row_bytes >= CELL_MIN_BYTES);
        }
        if cells.len() > 2 {
            proptest::prop_assert!(cells[1..cells.len() - 1].iter().all(|r| (r.end - r.start) * row_bytes >= CELL_MIN_BYTES));
        }
    }
}

#[test]
fn huggingface_writer_output_is_safetensors_with_the_shards() {
    let files: [&[u8]; 2] = [
        include_bytes!("../../../tests/fixtures/dcp/hf_2ranks/shard-00001-model-00001-of-00001.safetensors"),
        include_bytes!("../../../tests/fixtures/dcp/hf_2ranks/shard-00002-model-00001-of-00001.safetensors"),
    ];
    let expected: Json = serde_json::from_str(include_str!("../../../tests/fixtures/dcp/hf_2ranks.expected.json"))
        .expect("expected.json");
    // Rank r's file holds rank r's chunk of every tensor, under the plain fqn.
    for (rank, file) in files.iter().enumerate() {
        let header = crate::safetensors::parse(file).expect("safetensors");
        let chunks: Vec<&Json> =
            expected["tensors"].as_array().expect("tensors").chunks(2).map(|per_rank| &per_rank[rank]).collect();
        assert_eq!(header.tensors.len(), chunks.len());
        for t in chunks {
            let fqn = t["fqn"].as_str().expect("fqn");
            let info = header.tensors.iter().find(|i| i.name == fqn).unwrap_or_else(|| panic!("{fqn}"));
            assert_eq!(info.shape, u64s(&t["sizes"]), "{fqn}");
            assert_eq!(fnv1a64(&file[info.begin as usize..info.end as usize]), t["fnv1a64"].as_str().expect("hash"));
        }
    }
}

#[test]
fn the_torch_save_reader_still_refuses_dcp_classes() {
    // Backwards compatibility: `data.pkl` of a torch.save archive accepts no DCP global.
    assert!(pickle::read(epoch1().metadata).is_err());
    assert!(pickle::read_with_classes(epoch1().metadata, METADATA_CLASSES).is_ok());
}

#[test]
fn every_truncation_of_metadata_is_an_error() {
    let m = epoch1().metadata;
    // Every third length (every one takes seconds in a debug build), and every one near the end.
    for len in (0..m.len()).step_by(3).chain(m.len().saturating_sub(64)..m.len()) {
        assert!(parse_metadata(&m[..len]).is_err(), "{len} bytes");
    }
}

#[test]
fn a_foreign_global_in_metadata_is_an_error() {
    // Same length, another module: nothing is looked up beyond the list.
    let m = epoch1().metadata;
    let needle = b"torch.distributed.checkpoint.filesystem";
    let at = m.windows(needle.len()).position(|w| w == needle).expect("module name");
    let mut evil = m.to_vec();
    evil[at..at + needle.len()].copy_from_slice(b"subprocess.xxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    assert!(matches!(parse_metadata(&evil), Err(Error::Pickle(_))));
}

#[test]
fn items_past_the_end_or_overlapping_are_errors() {
    let f = epoch1();
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let file = f.file("__0_0.distcp");
    // Truncated file: the last item runs past its end.
    for cut in [1, 100, file.len() / 2] {
        assert!(matches!(file_items(&file[..file.len() - cut], &metadata, "__0_0.distcp"), Err(Error::Items { .. })));
    }
    let mut damaged = metadata.clone();
    let second = damaged.items.iter().position(|i| i.file == "__0_0.distcp" && i.range.start > 0).expect("second item");
    damaged.items[second].range.start -= 1;
    assert!(matches!(file_items(file, &damaged, "__0_0.distcp"), Err(Error::Items { .. })));
    let mut huge = metadata.clone();
    huge.items[second].range.end = u64::MAX;
    assert!(matches!(file_items(file, &huge, "__0_0.distcp"), Err(Error::Items { .. })));
    // Two items of one name (parse_metadata refuses them; a caller's table might not).
    let mut twice = metadata.clone();
    for item in twice.items.iter_mut().filter(|i| i.file == "__0_0.distcp") {
        if let Some(moment) = item.fqn.strip_suffix("exp_avg_sq") {
            item.fqn = format!("{moment}exp_avg");
        }
    }
    assert!(matches!(file_items(file, &twice, "__0_0.distcp"), Err(Error::Items { .. })));
    // A file the metadata does not mention has no items: all of it is opaque.
    let found = file_items(file, &metadata, "__9_0.distcp").expect("found");
    assert_eq!(found.segments(), vec![(0..file.len() as u64, None)]);
}

#[test]
fn a_damaged_or_mismatched_item_is_opaque_and_the_rest_still_found() {
    let f = epoch1();
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let file = f.file("__0_0.distcp");
    let first = metadata.items_in("__0_0.distcp").next().expect("item").clone();
    let mut damaged = file.to_vec();
    damaged[first.range.start as usize] ^= 0xff;
    let found = file_items(&damaged, &metadata, "__0_0.distcp").expect("found");
    assert!(found.items[0].opaque.is_some() && found.items[0].storages.is_empty());
    assert!(found.items[1..].iter().all(|i| i.opaque.is_none() && i.storages.len() == 1));
    check_cover(&damaged, &found);
    // .metadata saying another dtype or shape than the archive holds: opaque too.
    let mut other = metadata.clone();
    let i = other.items.iter().position(|i| i.name() == first.name()).expect("first");
    if let ItemKind::Tensor { dtype, sizes, .. } = &mut other.items[i].kind {
        *dtype = Some(Dtype::Bf16);
        sizes[0] += 1;
    }
    let found = file_items(file, &other, "__0_0.distcp").expect("found");
    assert!(found.items[0].opaque.is_some());
    // Transformed items (a storage extension such as compression) are opaque.
    let mut transformed = metadata.clone();
    transformed.items[i].transformed = true;
    assert!(file_items(file, &transformed, "__0_0.distcp").expect("found").items[0].opaque.is_some());
}

#[test]
fn walking_damaged_runs_of_archives_is_an_error_not_a_panic() {
    let file = epoch1().file("__1_0.distcp");
    let ends: HashSet<usize> = walk_archives(file).expect("walk").items.iter().map(|i| i.range.end as usize).collect();
    for len in (1..file.len()).step_by(7).filter(|len| !ends.contains(len)) {
        assert!(walk_archives(&file[..len]).is_err(), "{len} bytes");
    }
    let mut junk = file.to_vec();
    junk.extend(b"trailing bytes");
    assert!(walk_archives(&junk).is_err());
    assert_eq!(walk_archives(b"").expect("empty").items, vec![]);
}

#[test]
fn relative_paths_must_stay_inside_the_directory() {
    for ok in ["__0_0.distcp", "sub/__0_0.distcp"] {
        assert!(plain_relative(ok), "{ok}");
    }
    for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\\b"] {
        assert!(!plain_relative(bad), "{bad}");
    }
}

/// What a `ckpt.dcp.Writer` rank reports of `file`: `.metadata`'s items in it (the same fqn,
/// chunk and range as DCP's write results).
fn reported(metadata: &Metadata, file: &str) -> Vec<Item> {
    metadata.items_in(file).cloned().collect()
}

#[test]
fn a_writers_report_cuts_and_names_a_file_as_its_metadata_does() {
    for f in [epoch1(), four_ranks(), objects()] {
        let metadata = parse_metadata(f.metadata).expect("metadata");
        for (name, bytes) in f.files {
            let mut items = reported(&metadata, name);
            // In any order, under any file name (the file is named by the caller).
            items.reverse();
            for i in &mut items {
                i.file = "elsewhere".into();
            }
            let cut = cut_by_written_items(bytes, name, &items).expect("cut");
            assert_eq!(cut, file_items(bytes, &metadata, name).expect("found"), "{name}");
            assert!(cut.items.iter().all(|i| !i.name.starts_with("archive.")), "{name}");
        }
    }
}

#[test]
fn a_report_that_does_not_fit_the_file_falls_back_to_the_walk() {
    let f = epoch1();
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let name = "__1_0.distcp";
    let file = f.file(name);
    let walked = walk_archives(file).expect("walk");
    let honest = reported(&metadata, name);
    let n = honest.len();
    assert!(n >= 3);
    let hostile: Vec<(&str, Vec<Item>)> = vec![
        ("none", vec![]),
        ("one missing (a gap)", honest[1..].to_vec()),
        ("the last missing", honest[..n - 1].to_vec()),
        ("overlapping", {
            let mut v = honest.clone();
            v[1].range.start -= 1;
            v
        }),
        ("past the end", {
            let mut v = honest.clone();
            v[n - 1].range.end += 1;
            v
        }),
        ("ending at u64::MAX", {
            let mut v = honest.clone();
            v[n - 1].range.end = u64::MAX;
            v
        }),
        ("backwards", {
            let mut v = honest.clone();
            v[0].range = v[0].range.end..v[0].range.start;
            v
        }),
        ("not at archive starts", {
            let mut v = honest.clone();
            v[0].range.end += 8;
            v[1].range.start += 8;
            v
        }),
        ("two of one name", {
            let mut v = honest.clone();
            v[1].fqn = v[0].fqn.clone();
            v[1].kind = v[0].kind.clone();
            v
        }),
        ("a chunk outside its tensor", {
            let mut v = honest.clone();
            if let ItemKind::Tensor { offsets, .. } = &mut v[0].kind {
                offsets[0] = u64::MAX;
            }
            v
        }),
        ("dimensions that disagree", {
            let mut v = honest.clone();
            if let ItemKind::Tensor { sizes, .. } = &mut v[0].kind {
                sizes.push(1);
            }
            v
        }),
        ("another dtype", {
            let mut v = honest.clone();
            if let ItemKind::Tensor { dtype, torch_dtype, .. } = &mut v[0].kind {
                (*dtype, *torch_dtype) = (Some(Dtype::Bf16), "bfloat16".into());
            }
            v
        }),
        ("transformed", {
            let mut v = honest.clone();
            v[0].transformed = true;
            v
        }),
    ];
    for (what, items) in hostile {
        let cut = cut_by_written_items(file, name, &items).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(cut, walked, "{what}");
    }
    // A file the walk cannot read either keeps an honest report's cut, its odd item opaque,
    // as `.metadata` would cut it; a report that does not fit it is an error (opaque bytes).
    let mut damaged = file.to_vec();
    damaged[honest[0].range.start as usize] ^= 0xff;
    assert!(walk_archives(&damaged).is_err());
    let cut = cut_by_written_items(&damaged, name, &honest).expect("cut");
    assert_eq!(cut, file_items(&damaged, &metadata, name).expect("found"));
    assert!(cut.items[0].opaque.is_some() && cut.items[1..].iter().all(|i| i.opaque.is_none()));
    assert!(cut_by_written_items(&damaged, name, &honest[1..]).is_err());
}

#[test]
fn random_reports_never_panic() {
    let f = epoch1();
    let metadata = parse_metadata(f.metadata).expect("metadata");
    let name = "__0_0.distcp";
    let file = f.file(name);
    let walked = walk_archives(file).expect("walk");
    let honest = reported(&metadata, name);
    let len = file.len() as u64;
    // A small xorshift: reproducible, no dependency.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound.max(1)
    };
    for _ in 0..300 {
        let mut items = honest.clone();
        for item in &mut items {
            if next(4) == 0 {
                let (a, b) = (next(len + 2), next(len + 2));
                item.range = a.min(b)..a.max(b);
            }
        }
        let cut = cut_by_written_items(file, name, &items).expect("the walk reads the file");
        if cut != walked {
            assert_eq!(cut, file_items(file, &metadata, name).expect("found"));
        }
    }
}
