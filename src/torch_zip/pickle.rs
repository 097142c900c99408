//! A restricted pickle reader for `data.pkl` of `torch.save` archives. It never executes
//! anything: it interprets the few opcodes a state dict uses into a tree of plain values, knows
//! four kinds of globals by name (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_parameter` and the typed storage classes such as `torch.FloatStorage`)
//! and turns every persistent id `('storage', <storage type>, key, location, numel)` into a
//! storage reference. Any other opcode or global is an error (the caller then keeps the file as
//! opaque bytes). [`read_with_classes`] also accepts the globals of a caller's list (the
//! dataclasses of a `torch.distributed.checkpoint` `.metadata` file, say): each is only ever a
//! name, and calling or instantiating it (`REDUCE`, `NEWOBJ`) and setting its state (`BUILD`)
//! build a [`Value::Object`] recording the arguments and the state. Work and memory are bounded: the node budget covers every value built or copied
//! out of the memo, values nest at most [`MAX_DEPTH`] deep, the memo holds at most
//! [`MAX_MEMO`] entries.

use super::Error;
use crate::dtype::Dtype;
use std::collections::HashMap;

/// Values built or copied (from the memo) at most, marks included, a string counting one per 16
/// bytes: bounds time and memory (a few hundred MiB at worst) for any input. A state dict
/// costs about 10 per tensor, so this allows some 400,000 tensors.
pub(crate) const MAX_NODES: usize = 1 << 22;
/// Deepest nesting of containers accepted (also bounds the recursion of walking and dropping).
pub const MAX_DEPTH: usize = 256;
/// Most memo entries.
pub const MAX_MEMO: usize = 1 << 24;

/// A storage found through a persistent id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageRef {
    /// The key: the archive entry `<prefix>/data/<key>` holds its bytes.
    pub key: String,
    /// Element type, from the storage class.
    pub dtype: Dtype,
    /// Number of elements.
    pub numel: u64,
}

/// A global the reader knows. Nothing is ever called: each is interpreted by [`Value::reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    Storage(Dtype),
    /// A global of the caller's list ([`read_with_classes`]), by its full dotted name.
    Class(&'static str),
}

impl Global {
    /// The global `module.name`: one the reader interprets, else one of `classes`.
    fn lookup(module: &str, name: &str, classes: &[&'static str]) -> Option<Global> {
        Global::of(module, name).or_else(|| {
            classes
                .iter()
                .find(|c| c.len() == module.len() + 1 + name.len() && c.starts_with(module) && c.ends_with(name))
                .filter(|c| c.as_bytes()[module.len()] == b'.')
                .map(|c| Global::Class(c))
        })
    }

    fn of(module: &str, name: &str) -> Option<Global> {
        Some(match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
            ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
            ("torch", storage) => Global::Storage(match storage {
                "FloatStorage" => Dtype::F32,
                "DoubleStorage" => Dtype::F64,
                "HalfStorage" => Dtype::F16,
                "BFloat16Storage" => Dtype::Bf16,
                "LongStorage" => Dtype::I64,
                "IntStorage" => Dtype::I32,
                "ShortStorage" => Dtype::I16,
                "CharStorage" => Dtype::I8,
                "ByteStorage" => Dtype::U8,
                "BoolStorage" => Dtype::Bool,
                _ => return None,
            }),
            _ => return None,
        })
    }
}

/// A value of the pickle, as far as finding tensors needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`, booleans, numbers, byte strings: leaves without a name of their own.
    Leaf,
    /// An integer (dict keys and tensor geometry need its value).
    Int(i64),
    /// A string.
    Str(String),
    /// A tuple or list, with its nesting depth (1: holds no containers).
    Seq(Vec<Value>, usize),
    /// A dict or OrderedDict, items in insertion order, with its nesting depth.
    Dict(Vec<(Value, Value)>, usize),
    /// A storage: index into [`Pickle::storages`].
    Storage(usize),
    /// A tensor viewing a storage.
    Tensor {
        /// Index into [`Pickle::storages`].
        storage: usize,
        /// Offset into the storage, in elements.
        offset: u64,
        /// Dimensions.
        shape: Vec<u64>,
        /// Strides, in elements.
        stride: Vec<u64>,
    },
    /// A known global, only ever reduced (or, for one of the caller's classes, kept as a value:
    /// `torch.float32` in a `.metadata` file).
    #[doc(hidden)]
    Global(GlobalRef),
    /// An instance of one of the caller's classes ([`read_with_classes`]), as the pickle describes
    /// it: nothing was constructed or called.
    Object {
        /// The class (or function) called, its full dotted name as listed by the caller.
        class: &'static str,
        /// The arguments it was called with (`REDUCE`, `NEWOBJ`).
        args: Vec<Value>,
        /// The state set by `BUILD` (a dataclass's field dict, or what `__getstate__` returned).
        state: Option<Box<Value>>,
        /// Nesting depth, as for containers.
        depth: usize,
    },
}

/// Opaque handle of a known global (kept private: nothing outside reduces it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalRef(Global);

impl GlobalRef {
    /// The full dotted name, for a global of the caller's list ([`read_with_classes`]).
    pub fn class(&self) -> Option<&'static str> {
        match self.0 {
            Global::Class(name) => Some(name),
            _ => None,
        }
    }
}

/// The result of reading a pickle.
#[derive(Debug)]
pub struct Pickle {
    /// The value the pickle stops with.
    pub root: Value,
    /// The storages, in order of first appearance.
    pub storages: Vec<StorageRef>,
}

/// Nodes in `v`, itself included (what copying it costs).
fn size_of(v: &Value) -> usize {
    match v {
        Value::Seq(items, _) => 1 + items.iter().map(size_of).sum::<usize>(),
        Value::Dict(items, _) => 1 + items.iter().map(|(k, v)| size_of(k) + size_of(v)).sum::<usize>(),
        Value::Tensor { shape, stride, .. } => 1 + shape.len() + stride.len(),
        Value::Str(text) => 1 + text.len() / 16,
        Value::Object { args, state, .. } => {
            1 + args.iter().map(size_of).sum::<usize>() + state.as_deref().map_or(0, size_of)
        }
        _ => 1,
    }
}

/// Nesting depth of `v` (kept in each container, so this is O(1)).
fn depth_of(v: &Value) -> usize {
    match v {
        Value::Seq(_, d) | Value::Dict(_, d) | Value::Object { depth: d, .. } => *d,
        _ => 0,
    }
}

/// A tuple or list of `items`, its depth checked.
fn seq(items: Vec<Value>, at: usize) -> Result<Value, Error> {
    let depth = 1 + items.iter().map(depth_of).max().unwrap_or(0);
    if depth > MAX_DEPTH {
        return Err(bad(at, format!("values nested deeper than {MAX_DEPTH}")));
    }
    Ok(Value::Seq(items, depth))
}

fn bad(at: usize, reason: impl Into<String>) -> Error {
    Error::Pickle { offset: at, reason: reason.into() }
}

/// The reader's state.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
    storages: Vec<StorageRef>,
    /// Storage index by key.
    storage_index: HashMap<String, usize>,
    nodes: usize,
    /// Globals accepted besides the built-in ones, as [`Global::Class`].
    classes: &'a [&'static str],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let b = self.at.checked_add(n).and_then(|end| self.bytes.get(self.at..end));
        let b = b.ok_or_else(|| bad(self.at, "truncated"))?;
        self.at += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    fn uint(&mut self, n: usize) -> Result<u64, Error> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }
    fn string(&mut self, n: u64) -> Result<String, Error> {
        let n = usize::try_from(n).map_err(|_| bad(self.at, "string length"))?;
        self.charge(1 + n / 16)?;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    /// A `GLOBAL` argument: a line of text.
    fn line(&mut self) -> Result<&'a str, Error> {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        let end = rest.iter().take(256).position(|&b| b == b'\n').ok_or_else(|| bad(self.at, "unterminated line"))?;
        self.at += end + 1;
        std::str::from_utf8(&rest[..end]).map_err(|_| bad(self.at, "global name is not UTF-8"))
    }
    fn charge(&mut self, n: usize) -> Result<(), Error> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(bad(self.at, format!("more than {MAX_NODES} values")));
        }
        Ok(())
    }
    fn push(&mut self, v: Value) -> Result<(), Error> {
        self.charge(1)?;
        self.stack.push(v);
        Ok(())
    }
    fn pop(&mut self) -> Result<Value, Error> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(bad(self.at, "pop across a mark"));
        }
        self.stack.pop().ok_or_else(|| bad(self.at, "stack underflow"))
    }
    fn top(&mut self) -> Result<&mut Value, Error> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(bad(self.at, "no object above the mark"));
        }
        self.stack.last_mut().ok_or_else(|| bad(self.at, "stack underflow"))
    }
    /// The items pushed since the last mark, removed from the stack with the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, Error> {
        let m = self.marks.pop().ok_or_else(|| bad(self.at, "no mark"))?;
        Ok(self.stack.split_off(m))
    }
    fn memo_put(&mut self, key: u64) -> Result<(), Error> {
        let v = self.stack.last().ok_or_else(|| bad(self.at, "memoize an empty stack"))?.clone();
        self.charge(size_of(&v))?;
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&key) {
            return Err(bad(self.at, format!("more than {MAX_MEMO} memo entries")));
        }
        self.memo.insert(key, v);
        Ok(())
    }
    fn memo_get(&mut self, key: u64) -> Result<(), Error> {
        let v = self.memo.get(&key).ok_or_else(|| bad(self.at, format!("memo entry {key} missing")))?;
        let n = size_of(v);
        let v = v.clone();
        self.charge(n)?;
        self.stack.push(v);
        Ok(())
    }
    /// Appends `items` to the list on top of the stack.
    fn extend_list(&mut self, items: Vec<Value>) -> Result<(), Error> {
        let at = self.at;
        let child = 1 + items.iter().map(depth_of).max().unwrap_or(0);
        if child > MAX_DEPTH {
            return Err(bad(at, format!("values nested deeper than {MAX_DEPTH}")));
        }
        match self.top()? {
            Value::Seq(list, depth) => {
                list.extend(items);
                *depth = (*depth).max(child);
                Ok(())
            }
            _ => Err(bad(at, "append to a non-list")),
        }
    }
    /// Sets `items` (key, value, key, value, ...) in the dict on top of the stack.
    fn set_items(&mut self, items: Vec<Value>) -> Result<(), Error> {
        if !items.len().is_multiple_of(2) {
            return Err(bad(self.at, "odd number of dict items"));
        }
        let at = self.at;
        let child = 1 + items.iter().map(depth_of).max().unwrap_or(0);
        if child > MAX_DEPTH {
            return Err(bad(at, format!("values nested deeper than {MAX_DEPTH}")));
        }
        let mut it = items.into_iter();
        match self.top()? {
            Value::Dict(d, depth) => {
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
                *depth = (*depth).max(child);
                Ok(())
            }
            _ => Err(bad(at, "set items of a non-dict")),
        }
    }
    /// `('storage', <storage type>, key, location, numel)` → a storage reference.
    fn persistent_load(&mut self, pid: Value) -> Result<Value, Error> {
        let at = self.at;
        let Value::Seq(items, _) = pid else { return Err(bad(at, "persistent id is not a tuple")) };
        let [Value::Str(tag), Value::Global(GlobalRef(Global::Storage(dtype))), Value::Str(key), Value::Str(_), Value::Int(numel)] =
            &items[..]
        else {
            return Err(bad(at, "persistent id is not ('storage', type, key, location, numel)"));
        };
        let numel = u64::try_from(*numel).map_err(|_| bad(at, "negative storage size"))?;
        if tag != "storage" {
            return Err(bad(at, format!("persistent id tag {tag:?}")));
        }
        let storage = StorageRef { key: key.clone(), dtype: *dtype, numel };
        let index = match self.storage_index.get(key) {
            Some(&i) if self.storages[i] == storage => i,
            Some(_) => return Err(bad(at, format!("storage {key:?} with two types or sizes"))),
            None => {
                self.storages.push(storage);
                self.storage_index.insert(key.clone(), self.storages.len() - 1);
                self.storages.len() - 1
            }
        };
        Ok(Value::Storage(index))
    }
    /// Interprets `callable(*args)` for the known globals; anything else is an error.
    fn reduce(&self, callable: Value, args: Value) -> Result<Value, Error> {
        let at = self.at;
        let Value::Global(GlobalRef(g)) = callable else { return Err(bad(at, "call of a non-global")) };
        let Value::Seq(args, depth) = args else { return Err(bad(at, "call arguments are not a tuple")) };
        if let Global::Class(class) = g {
            return object(class, args, depth, at);
        }
        let ints = |v: &Value| -> Option<Vec<u64>> {
            match v {
                Value::Seq(items, _) => items
                    .iter()
                    .map(|i| match i {
                        Value::Int(n) => u64::try_from(*n).ok(),
                        _ => None,
                    })
                    .collect(),
                _ => None,
            }
        };
        match (g, &args[..]) {
            (Global::OrderedDict, []) => Ok(Value::Dict(Vec::new(), 1)),
            // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
            (Global::RebuildTensorV2, [Value::Storage(s), Value::Int(offset), size, stride, _, _, ..]) => {
                let (Some(shape), Some(stride), Ok(offset)) = (ints(size), ints(stride), u64::try_from(*offset)) else {
                    return Err(bad(at, "tensor geometry is not integers"));
                };
                if shape.len() != stride.len() {
                    return Err(bad(at, "tensor size and stride differ in length"));
                }
                Ok(Value::Tensor { storage: *s, offset, shape, stride })
            }
            // (data, requires_grad, backward_hooks): the parameter's tensor.
            (Global::RebuildParameter, [t @ Value::Tensor { .. }, _, _]) => Ok(t.clone()),
            _ => Err(bad(at, format!("unsupported call of {g:?} with {} arguments", args.len()))),
        }
    }

    /// Interprets the pickle up to STOP, one opcode at a time, each by the family that knows
    /// it.
    fn run(mut self) -> Result<Pickle, Error> {
        loop {
            let op_at = self.at;
            let op = self.u8()?;
            if op == b'.' {
                // STOP
                let root = self.pop()?;
                return Ok(Pickle { root, storages: self.storages });
            }
            if !(self.literal(op, op_at)? || self.collection(op, op_at)? || self.call(op, op_at)?) {
                return Err(bad(op_at, format!("unsupported opcode 0x{op:02x}")));
            }
        }
    }

    /// Opcodes that read a value from the stream and push it, or set the protocol, a frame or a
    /// mark; `false` for any other.
    fn literal(&mut self, op: u8, op_at: usize) -> Result<bool, Error> {
        match op {
            0x80 => {
                // PROTO
                let p = self.u8()?;
                if p > 5 {
                    return Err(bad(op_at, format!("pickle protocol {p}")));
                }
            }
            0x95 => {
                // FRAME: a length hint only.
                self.take(8)?;
            }
            b'(' => {
                self.charge(1)?;
                self.marks.push(self.stack.len());
            }
            b'}' => self.push(Value::Dict(Vec::new(), 1))?,
            b']' | b')' => self.push(Value::Seq(Vec::new(), 1))?,
            b'N' | 0x88 | 0x89 => self.push(Value::Leaf)?,
            b'G' => {
                self.take(8)?;
                self.push(Value::Leaf)?;
            }
            b'K' => {
                let n = self.uint(1)? as i64;
                self.push(Value::Int(n))?;
            }
            b'M' => {
                let n = self.uint(2)? as i64;
                self.push(Value::Int(n))?;
            }
            b'J' => {
                let n = self.uint(4)? as u32 as i32;
                self.push(Value::Int(i64::from(n)))?;
            }
            0x8a => {
                // LONG1: little-endian two's complement of n bytes.
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                let v = if n == 0 {
                    Value::Int(0)
                } else if n <= 8 {
                    let mut buf = if b[n - 1] & 0x80 != 0 { [0xff; 8] } else { [0; 8] };
                    buf[..n].copy_from_slice(b);
                    Value::Int(i64::from_le_bytes(buf))
                } else {
                    Value::Leaf
                };
                self.push(v)?;
            }
            b'X' | 0x8c | 0x8d => {
                // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
                let n = match op {
                    b'X' => self.uint(4)?,
                    0x8c => self.uint(1)?,
                    _ => self.uint(8)?,
                };
                let s = self.string(n)?;
                self.push(Value::Str(s))?;
            }
            b'C' | b'B' | 0x8e => {
                // SHORT_BINBYTES, BINBYTES, BINBYTES8: skipped, a leaf.
                let n = match op {
                    b'C' => self.uint(1)?,
                    b'B' => self.uint(4)?,
                    _ => self.uint(8)?,
                };
                self.take(usize::try_from(n).map_err(|_| bad(op_at, "bytes length"))?)?;
                self.push(Value::Leaf)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Opcodes that build tuples, lists and dicts, or use the memo; `false` for any other.
    fn collection(&mut self, op: u8, op_at: usize) -> Result<bool, Error> {
        match op {
            b'q' | b'r' => {
                let key = self.uint(if op == b'q' { 1 } else { 4 })?;
                self.memo_put(key)?;
            }
            0x94 => {
                // MEMOIZE
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            b'h' | b'j' => {
                let key = self.uint(if op == b'h' { 1 } else { 4 })?;
                self.memo_get(key)?;
            }
            b't' => {
                let items = self.pop_mark()?;
                let v = seq(items, op_at)?;
                self.push(v)?;
            }
            0x85..=0x87 => {
                // TUPLE1..3
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                let v = seq(items, op_at)?;
                self.push(v)?;
            }
            b'a' => {
                let v = self.pop()?;
                self.extend_list(vec![v])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend_list(items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Opcodes that name globals and call them: GLOBAL, BINPERSID, REDUCE, BUILD, NEWOBJ;
    /// `false` for any other.
    fn call(&mut self, op: u8, op_at: usize) -> Result<bool, Error> {
        match op {
            b'c' | 0x93 => {
                // GLOBAL (two lines) or STACK_GLOBAL (two strings on the stack).
                let (module, name) = if op == b'c' {
                    (self.line()?.to_string(), self.line()?.to_string())
                } else {
                    match (self.pop()?, self.pop()?) {
                        (Value::Str(n), Value::Str(m)) => (m, n),
                        _ => return Err(bad(op_at, "STACK_GLOBAL of non-strings")),
                    }
                };
                let g = Global::lookup(&module, &name, self.classes)
                    .ok_or_else(|| bad(op_at, format!("unknown global {module}.{name}")))?;
                self.push(Value::Global(GlobalRef(g)))?;
            }
            b'Q' => {
                // BINPERSID
                let pid = self.pop()?;
                let v = self.persistent_load(pid)?;
                self.push(v)?;
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.reduce(callable, args)?;
                self.push(v)?;
            }
            b'b' => {
                // BUILD: state set on an OrderedDict (torch's `_metadata`); no tensors live
                // there that matter for naming, so the state is dropped. On an object of the
                // caller's classes, the state is kept (a dataclass's fields).
                let state = self.pop()?;
                let child = 1 + depth_of(&state);
                match self.top()? {
                    Value::Dict(..) => {}
                    Value::Object { state: slot @ None, depth, .. } => {
                        if child > MAX_DEPTH {
                            return Err(bad(op_at, format!("values nested deeper than {MAX_DEPTH}")));
                        }
                        *slot = Some(Box::new(state));
                        *depth = (*depth).max(child);
                    }
                    Value::Object { .. } => return Err(bad(op_at, "BUILD of an object twice")),
                    _ => return Err(bad(op_at, "BUILD of a non-dict")),
                }
            }
            0x81 => {
                // NEWOBJ: `cls.__new__(cls, *args)`, only for the caller's classes.
                let args = self.pop()?;
                let cls = self.pop()?;
                let (Value::Global(GlobalRef(Global::Class(class))), Value::Seq(args, depth)) = (cls, args) else {
                    return Err(bad(op_at, "NEWOBJ of a class not listed or without an argument tuple"));
                };
                let v = object(class, args, depth, op_at)?;
                self.push(v)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// An instance of `class` made with `args` (a tuple of nesting depth `depth`).
fn object(class: &'static str, args: Vec<Value>, depth: usize, at: usize) -> Result<Value, Error> {
    if depth + 1 > MAX_DEPTH {
        return Err(bad(at, format!("values nested deeper than {MAX_DEPTH}")));
    }
    Ok(Value::Object { class, args, state: None, depth: depth + 1 })
}

/// Reads `bytes` (a `data.pkl`) without executing anything.
pub fn read(bytes: &[u8]) -> Result<Pickle, Error> {
    read_with_classes(bytes, &[])
}

/// Reads `bytes` as [`read`] does, also accepting the globals named in `classes` (full dotted
/// names such as `torch.distributed.checkpoint.metadata.Metadata` or `torch.float32`): each is
/// a [`Value::Global`] until called or instantiated, which makes a [`Value::Object`]. Nothing is
/// executed either way.
pub fn read_with_classes(bytes: &[u8], classes: &[&'static str]) -> Result<Pickle, Error> {
    let reader = Reader {
        bytes,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        storages: Vec::new(),
        storage_index: HashMap::new(),
        nodes: 0,
        classes,
    };
    reader.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_tensor_in_an_ordered_dict() {
        // collections.OrderedDict([('w', tensor)]) with a FloatStorage of 6 elements, 2x3.
        let mut p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00w".to_vec();
        p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n");
        p.extend(b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x00K\x02K\x03\x86K\x03K\x01\x86\x89)tRs.");
        let pickle = read(&p).unwrap();
        assert_eq!(pickle.storages, vec![StorageRef { key: "0".into(), dtype: Dtype::F32, numel: 6 }]);
        let Value::Dict(items, _) = pickle.root else { panic!("{:?}", pickle.root) };
        assert_eq!(items[0].0, Value::Str("w".into()));
        assert_eq!(items[0].1, Value::Tensor { storage: 0, offset: 0, shape: vec![2, 3], stride: vec![3, 1] });
    }

    #[test]
    fn unknown_globals_and_opcodes_are_errors() {
        for evil in [&b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00ls\x85R."[..], b"\x80\x02cbuiltins\neval\n.", b"I1\n."]
        {
            assert!(read(evil).is_err(), "{evil:?}");
        }
    }

    #[test]
    fn memo_blowup_and_deep_nesting_are_bounded() {
        // Each step doubles a list through the memo: 2^64 nodes if copies were free.
        let mut p = b"\x80\x02]q\x00".to_vec();
        for _ in 0..64 {
            p.extend(b"(h\x00h\x00tq\x00");
        }
        p.push(b'.');
        assert!(read(&p).is_err());
        let mut deep = b"\x80\x02".to_vec();
        deep.extend(std::iter::repeat_n(b']', 100_000));
        deep.extend(std::iter::repeat_n(b'a', 99_999));
        deep.push(b'.');
        assert!(read(&deep).is_err());
    }
}
