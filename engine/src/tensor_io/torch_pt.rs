//! Torch `.pt` files (the zip format of `torch.save`) read without executing code.
//!
//! `data.pkl` is interpreted by candle's pickle virtual machine, which only builds a
//! tree of values: a GLOBAL opcode yields a class name, never an import, and nothing
//! is called. We then recognise exactly one construction, torch's
//! `_rebuild_tensor_v2(storage, offset, size, stride, ..)`, and read the storage's
//! bytes from the archive ourselves. Everything else stays inert data.
//!
//! A tiny writer (one tensor or a dict of tensors, f32) exists for tests and fixtures.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::path::Path;

use candle_core::pickle::{Object, Stack};
use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

/// What a `.pt` file held, with tensors as f32 on the CPU.
#[derive(Debug, Clone)]
pub enum PtValue {
    Tensor(Tensor),
    Dict(BTreeMap<String, PtValue>),
    Str(String),
    Number(f64),
    /// Anything else (lists, None, unknown objects): kept inert.
    Other,
}

impl PtValue {
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            PtValue::Tensor(t) => Some(t),
            _ => None,
        }
    }

    pub fn get(&self, key: &str) -> Option<&PtValue> {
        match self {
            PtValue::Dict(d) => d.get(key),
            _ => None,
        }
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadFile { path: path.to_path_buf(), reason: reason.into() }
}

/// Reads a torch-saved value.
pub fn read_pt(path: &Path) -> Result<PtValue> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut zip =
        zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad(path, format!("not a torch zip file: {e}")))?;
    let pkl = zip
        .file_names()
        .flatten()
        .find(|n| n.ends_with("data.pkl"))
        .map(|n| n.into_owned())
        .ok_or_else(|| bad(path, "no data.pkl in the archive"))?;
    let dir = pkl.trim_end_matches("data.pkl").to_string();
    if let Ok(mut f) = zip.by_name(&format!("{dir}byteorder")) {
        let mut order = String::new();
        let _ = f.read_to_string(&mut order);
        if order.trim() == "big" {
            return Err(bad(path, "big-endian torch files are not supported"));
        }
    }
    let object = {
        let f = zip.by_name(&pkl).map_err(|e| bad(path, e.to_string()))?;
        let mut stack = Stack::empty();
        stack.read_loop(&mut BufReader::new(f)).map_err(|e| bad(path, format!("pickle: {e}")))?;
        stack.finalize().map_err(|e| bad(path, format!("pickle: {e}")))?
    };
    let mut reader = Reader { zip: &mut zip, dir, path };
    reader.value(object)
}

struct Reader<'a, R: Read + std::io::Seek> {
    zip: &'a mut zip::ZipArchive<R>,
    dir: String,
    path: &'a Path,
}

impl<R: Read + std::io::Seek> Reader<'_, R> {
    fn value(&mut self, o: Object) -> Result<PtValue> {
        Ok(match o {
            Object::Dict(items) => {
                let mut d = BTreeMap::new();
                for (k, v) in items {
                    if let Object::Unicode(k) = k {
                        d.insert(k, self.value(v)?);
                    }
                }
                PtValue::Dict(d)
            }
            Object::Unicode(s) => PtValue::Str(s),
            Object::Int(i) => PtValue::Number(i as f64),
            Object::Long(i) => PtValue::Number(i as f64),
            Object::Float(f) => PtValue::Number(f),
            Object::Reduce { callable, args } => match rebuild_target(*callable, *args) {
                Some(args) => PtValue::Tensor(self.tensor(args)?),
                None => PtValue::Other,
            },
            _ => PtValue::Other,
        })
    }

    /// `(storage, offset, size, stride, ..)` -> the tensor.
    fn tensor(&mut self, args: Vec<Object>) -> Result<Tensor> {
        let path = self.path;
        let malformed = || bad(path, "malformed tensor record in data.pkl");
        let mut args = args.into_iter();
        let (Some(Object::PersistentLoad(storage)), Some(offset), Some(size), Some(stride)) =
            (args.next(), args.next(), args.next(), args.next())
        else {
            return Err(malformed());
        };
        let Object::Tuple(storage) = *storage else {
            return Err(malformed());
        };
        let (class, key) = match storage.as_slice() {
            [_, Object::Class { class_name, .. }, Object::Unicode(key), ..] => (class_name.clone(), key.clone()),
            _ => return Err(malformed()),
        };
        let dtype = match class.as_str() {
            "FloatStorage" => DType::F32,
            "HalfStorage" => DType::F16,
            "BFloat16Storage" => DType::BF16,
            "DoubleStorage" => DType::F64,
            "BoolStorage" | "ByteStorage" => DType::U8,
            "LongStorage" => DType::I64,
            other => return Err(bad(path, format!("unsupported tensor storage {other}"))),
        };
        let ints = |o: Object| -> Option<Vec<usize>> {
            match o {
                Object::Tuple(v) => v.into_iter().map(|x| int(&x).map(|i| i as usize)).collect(),
                _ => None,
            }
        };
        let offset = int(&offset).ok_or_else(malformed)? as usize;
        let (size, stride) = (ints(size).ok_or_else(malformed)?, ints(stride).ok_or_else(malformed)?);

        let mut bytes = Vec::new();
        self.zip
            .by_name(&format!("{}data/{key}", self.dir))
            .map_err(|e| bad(path, format!("storage {key}: {e}")))?
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(path, e))?;
        let numel = bytes.len() / dtype.size_in_bytes();
        let storage = Tensor::from_raw_buffer(&bytes[..numel * dtype.size_in_bytes()], dtype, &[numel], &Device::Cpu)?
            .to_dtype(DType::F32)?;
        // Gather the strided view.
        let count: usize = size.iter().product();
        let mut index = Vec::with_capacity(count);
        for flat in 0..count {
            let (mut rem, mut at) = (flat, offset);
            for d in (0..size.len()).rev() {
                at += (rem % size[d]) * stride[d];
                rem /= size[d];
            }
            if at >= numel {
                return Err(bad(path, format!("tensor view exceeds its storage {key}")));
            }
            index.push(at as u32);
        }
        let index = Tensor::from_vec(index, count, &Device::Cpu)?;
        Ok(storage.index_select(&index, 0)?.reshape(size)?)
    }
}

fn int(o: &Object) -> Option<i64> {
    match o {
        Object::Int(i) => Some(*i as i64),
        Object::Long(i) => Some(*i),
        _ => None,
    }
}

/// The arguments of `_rebuild_tensor_v2`, seen through torch's wrappers
/// (`_rebuild_from_type_v2`, `_rebuild_parameter`); `None` for any other call.
fn rebuild_target(callable: Object, args: Object) -> Option<Vec<Object>> {
    let Object::Class { module_name, class_name } = callable else {
        return None;
    };
    let Object::Tuple(mut args) = args else {
        return None;
    };
    match (module_name.as_str(), class_name.as_str()) {
        ("torch._utils", "_rebuild_tensor_v2") => Some(args),
        ("torch._utils", "_rebuild_parameter") if !args.is_empty() => match args.remove(0) {
            Object::Reduce { callable, args } => rebuild_target(*callable, *args),
            _ => None,
        },
        ("torch._tensor", "_rebuild_from_type_v2") if args.len() >= 3 => {
            let inner_args = args.remove(2);
            let func = args.remove(0);
            rebuild_target(func, inner_args)
        }
        _ => None,
    }
}

// ---- writing (tests, fixtures) ----

fn unicode(out: &mut Vec<u8>, s: &str) {
    out.push(b'X');
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
}

fn int32(out: &mut Vec<u8>, i: usize) {
    out.push(b'J');
    out.extend((i as i32).to_le_bytes());
}

/// Pickles `_rebuild_tensor_v2` of a contiguous f32 storage named `key`.
fn pickle_tensor(out: &mut Vec<u8>, key: &str, dims: &[usize]) {
    out.extend(b"ctorch._utils\n_rebuild_tensor_v2\n(");
    out.push(b'(');
    unicode(out, "storage");
    out.extend(b"ctorch\nFloatStorage\n");
    unicode(out, key);
    unicode(out, "cpu");
    int32(out, dims.iter().product());
    out.extend(b"tQ"); // tuple, persistent id
    int32(out, 0);
    out.push(b'(');
    for &d in dims {
        int32(out, d);
    }
    out.push(b't');
    out.push(b'(');
    let mut stride = 1;
    let mut strides = vec![0; dims.len()];
    for (s, d) in strides.iter_mut().zip(dims).rev() {
        *s = stride;
        stride *= d;
    }
    for s in strides {
        int32(out, s);
    }
    out.push(b't');
    out.push(0x89); // requires_grad = False
    out.extend(b"ccollections\nOrderedDict\n)R"); // backward hooks
    out.extend(b"tR");
}

/// Writes tensors as `torch.save` would: one bare tensor (`key` None) or a dict.
pub fn write_pt(path: &Path, tensors: &[(Option<&str>, &Tensor)]) -> Result<()> {
    let io = |e: std::io::Error| Error::io(path, e);
    let mut pkl = vec![0x80, 2];
    let dict = tensors.iter().any(|(k, _)| k.is_some());
    if dict {
        pkl.extend(b"}(");
    }
    let mut storages = Vec::new();
    for (i, (name, t)) in tensors.iter().enumerate() {
        if let Some(name) = name {
            unicode(&mut pkl, name);
        }
        pickle_tensor(&mut pkl, &i.to_string(), t.dims());
        let v: Vec<f32> = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        storages.push(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    }
    if dict {
        pkl.push(b'u');
    }
    pkl.push(b'.');

    let file = std::fs::File::create(path).map_err(io)?;
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let zerr = |e: zip::result::ZipError| bad(path, e.to_string());
    let stem = "archive";
    zip.start_file(format!("{stem}/data.pkl"), opts).map_err(zerr)?;
    zip.write_all(&pkl).map_err(io)?;
    zip.start_file(format!("{stem}/byteorder"), opts).map_err(zerr)?;
    zip.write_all(b"little").map_err(io)?;
    for (i, s) in storages.iter().enumerate() {
        zip.start_file(format!("{stem}/data/{i}"), opts).map_err(zerr)?;
        zip.write_all(s).map_err(io)?;
    }
    zip.start_file(format!("{stem}/version"), opts).map_err(zerr)?;
    zip.write_all(b"3\n").map_err(io)?;
    zip.finish().map_err(zerr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_tensor_and_dict() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tensor::arange(0f32, 24.0, &Device::Cpu).unwrap().reshape((2, 3, 4)).unwrap();
        let p = dir.path().join("t.pt");
        write_pt(&p, &[(None, &t)]).unwrap();
        let back = read_pt(&p).unwrap();
        let back = back.as_tensor().unwrap();
        assert_eq!(back.dims(), [2, 3, 4]);
        assert_eq!(
            back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );

        let m = Tensor::ones(5, DType::F32, &Device::Cpu).unwrap();
        let p = dir.path().join("d.pt");
        write_pt(&p, &[(Some("a"), &t), (Some("mask"), &m)]).unwrap();
        let d = read_pt(&p).unwrap();
        assert_eq!(d.get("mask").unwrap().as_tensor().unwrap().dims(), [5]);
        assert_eq!(d.get("a").unwrap().as_tensor().unwrap().dims(), [2, 3, 4]);
    }

    #[test]
    fn a_non_tensor_call_is_inert() {
        // GLOBAL os.system + REDUCE: the reader builds a value and never calls anything.
        let o = Object::Reduce {
            callable: Box::new(Object::Class { module_name: "os".into(), class_name: "system".into() }),
            args: Box::new(Object::Tuple(vec![Object::Unicode("rm -rf /".into())])),
        };
        assert!(rebuild_target(
            match &o {
                Object::Reduce { callable, .. } => (**callable).clone(),
                _ => unreachable!(),
            },
            Object::Tuple(vec![])
        )
        .is_none());
    }
}
