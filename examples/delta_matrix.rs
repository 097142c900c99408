//! Stored size of every version of a series against every earlier version, to compare delta
//! policies (which reference each version uses) without committing anything.
//!
//! For FILES (epochs in order), prints one line per epoch j: its standalone size, then its size
//! as a delta against epoch 0, 1, .., j−1. Sizes are what the store would spend on the tensors:
//! per tensor the smaller of delta and standalone (commit itself compares the delta with its
//! reference chain's standalone base object, which is close), payload plus 5 index bytes
//! per group; an unchanged tensor costs 0 (deduplicated). Headers and object framing are left
//! out. docs/BENCHMARKS.md ("Delta chain depth") simulates policies on this matrix.
//!
//! `cargo run --release --example delta_matrix -- EPOCH_0.safetensors EPOCH_1.safetensors ...`

use ckpt::codec::chunk::{encode_chunks, Data, Reference};
use ckpt::codec::{Grouping, Options};
use rayon::prelude::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes the store would spend on `new`'s tensors, against `old` when given.
fn stored_size(new: &[u8], old: Option<&[u8]>, options: &Options) -> Result<u64, BoxError> {
    let header = ckpt::safetensors::parse(new)?;
    let old_header = old.map(ckpt::safetensors::parse).transpose()?;
    let sizes = header
        .tensors
        .par_iter()
        .map(|t| -> Result<u64, BoxError> {
            let data = &new[t.begin as usize..t.end as usize];
            let grouping = Grouping::for_dtype(Some(t.dtype));
            let cost = |r: Option<&[u8]>| -> Result<u64, BoxError> {
                let chunks = encode_chunks(Data::Bytes(data), r.map(Reference::Bytes), grouping, options)?;
                Ok(chunks.iter().map(|c| c.payload.len() as u64 + 5 * grouping.width as u64).sum())
            };
            let reference = match (&old_header, old) {
                (Some(h), Some(o)) => h
                    .tensors
                    .iter()
                    .find(|x| x.name == t.name && x.dtype == t.dtype && x.shape == t.shape)
                    .map(|x| &o[x.begin as usize..x.end as usize]),
                _ => None,
            };
            match reference {
                Some(r) if r == data => Ok(0),
                Some(r) => Ok(cost(None)?.min(cost(Some(r))?)),
                None => cost(None),
            }
        })
        .collect::<Result<Vec<u64>, BoxError>>()?;
    Ok(sizes.iter().sum())
}

fn main() -> Result<(), BoxError> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: delta_matrix EPOCH_0.safetensors EPOCH_1.safetensors ...".into());
    }
    let data = files.iter().map(std::fs::read).collect::<Result<Vec<_>, _>>()?;
    let options = Options::default();
    for (j, new) in data.iter().enumerate() {
        let mut row = vec![stored_size(new, None, &options)?];
        for old in &data[..j] {
            row.push(stored_size(new, Some(old), &options)?);
        }
        println!("{}", row.iter().map(u64::to_string).collect::<Vec<_>>().join(" "));
    }
    Ok(())
}
