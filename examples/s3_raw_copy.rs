//! The baseline of `benches/remote_throughput.sh`: one file uploaded to, or downloaded from, an
//! S3-compatible server as a single object with `object_store` alone, configured as ckpt's S3
//! remote is (`AmazonS3Builder::from_env`: `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, credentials) and
//! uploaded as ckpt uploads a large object (multipart, parts of the same size, the same number in
//! flight). So the ratio of ckpt's time to this one's is what ckpt adds on top of the network path.
//!
//! `cargo run --release --example s3_raw_copy -- put FILE s3://BUCKET/KEY [PART_MIB] [IN_FLIGHT]`
//! `cargo run --release --example s3_raw_copy -- get s3://BUCKET/KEY FILE`
//! Prints the bytes moved and the wall time on stderr.

use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, WriteMultipart};
use std::io::{Read, Write};
use std::time::Instant;

fn store_and_key(url: &str) -> (object_store::aws::AmazonS3, StorePath) {
    let rest = url.strip_prefix("s3://").expect("an s3://BUCKET/KEY URL");
    let (bucket, key) = rest.split_once('/').expect("s3://BUCKET/KEY");
    let store = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).build().expect("S3 settings");
    (store, StorePath::from(key))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: s3_raw_copy put FILE s3://BUCKET/KEY [PART_MIB] [IN_FLIGHT] | get s3://BUCKET/KEY FILE";
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let start = Instant::now();
    let moved = match args.first().map(String::as_str) {
        Some("put") if args.len() >= 3 => {
            let part_size: usize = args.get(3).map_or(16, |s| s.parse().expect("PART_MIB")) << 20;
            let in_flight: usize = args.get(4).map_or(4, |s| s.parse().expect("IN_FLIGHT"));
            let (store, key) = store_and_key(&args[2]);
            let mut file = std::fs::File::open(&args[1]).expect("open FILE");
            runtime.block_on(async {
                let upload = store.put_multipart(&key).await.expect("start the upload");
                let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
                let mut total = 0u64;
                loop {
                    writer.wait_for_capacity(in_flight).await.expect("upload a part");
                    // Read one part into a buffer of its own (handed over to the part's request).
                    let mut part = Vec::with_capacity(part_size);
                    let n = (&mut file).take(part_size as u64).read_to_end(&mut part).expect("read FILE");
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    writer.put(bytes::Bytes::from(part));
                }
                writer.finish().await.expect("complete the upload");
                total
            })
        }
        Some("get") if args.len() == 3 => {
            let (store, key) = store_and_key(&args[1]);
            let mut out =
                std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&args[2]).expect("create FILE"));
            let total = runtime.block_on(async {
                let mut stream = store.get(&key).await.expect("get the object").into_stream();
                let mut total = 0u64;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.expect("download");
                    total += chunk.len() as u64;
                    out.write_all(&chunk).expect("write FILE");
                }
                total
            });
            out.flush().expect("write FILE");
            total
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let secs = start.elapsed().as_secs_f64();
    eprintln!("{} bytes in {secs:.2} s ({:.0} MiB/s)", moved, moved as f64 / secs / (1 << 20) as f64);
}
