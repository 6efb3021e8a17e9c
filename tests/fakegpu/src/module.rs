//! Modules, functions, the JIT linker and libraries. The fake does not run code: it only needs
//! kernel names (and the names and sizes of globals) from an image, which it reads from PTX
//! text (`.entry NAME`, `.global ... NAME[N]`), from an ELF cubin's symbol table, or from the
//! image `cuLinkComplete` makes (a header and the concatenated PTX of its inputs).
//!
//! A fat binary (what the CUDA runtime registers with `cuLibraryLoadData`, through a
//! `__fatBinC_Wrapper_t`) holds one entry per architecture; like the driver, the fake takes
//! the cubins built for its device (sm_90), else the newest PTX it could JIT, else refuses the
//! image (`CUDA_ERROR_NO_BINARY_FOR_GPU`). Entries are often compressed (LZ4 or zstd, by the
//! entry's flags); loading only reads the headers and copies the chosen entries, and the
//! names are read (and decompressed) at the first lookup, so a framework that registers
//! hundreds of fat binaries at start-up pays only for the few it uses.

use crate::mem::{self, Kind};
use crate::runtime::{Ctx, CuResult};
use gpuslice_abi::*;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The header of the images `cuLinkComplete` returns.
pub const LINKED_MAGIC: &[u8] = b"//fakegpu-linked-image\n.version 8.0\n";

const MODULE_MAGIC: u64 = 0x30D0_1E00_0000_FA4E;
const FUNC_MAGIC: u64 = 0xF0AC_0000_0000_FA4E;

/// A loaded module (also what a library handle points to).
#[repr(C)]
pub struct Module {
    magic: u64,
    /// Context it was loaded into (libraries: none until first use).
    pub ctx: Option<&'static Ctx>,
    /// Fat-binary entries not read yet (none for other images).
    pending: Vec<FatEntry>,
    /// Its kernels and globals, read at load or at the first lookup.
    names: OnceLock<CuResult<Names>>,
    globals: Mutex<HashMap<String, (u64, u64)>>,
}

/// The kernels and global sizes of a module.
struct Names {
    funcs: HashMap<String, &'static Func>,
    global_sizes: HashMap<String, u64>,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Module {
    const MAGIC: u64 = MODULE_MAGIC;
}

/// A kernel. CUfunction and CUkernel handles both point to one.
#[repr(C)]
pub struct Func {
    magic: u64,
    /// Its name.
    pub name: String,
    /// Whether it is `gpuslice_spin` (duration in its first u64 parameter).
    pub spin: bool,
    /// Its module.
    pub module: usize,
}

// SAFETY: #[repr(C)] with the magic first; values are only ever leaked.
unsafe impl crate::handle::Handle for Func {
    const MAGIC: u64 = FUNC_MAGIC;
}

/// What an image declares.
#[derive(Debug, Default, PartialEq)]
pub struct Declared {
    /// Kernel names.
    pub entries: Vec<String>,
    /// Global names and sizes in bytes.
    pub globals: Vec<(String, u64)>,
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '.'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Kernel and global names of PTX text.
pub fn parse_ptx(text: &str) -> Declared {
    let mut d = Declared::default();
    let mut words = text.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w == ".entry" {
            if let Some(n) = words.next() {
                let n = ident(n);
                if !n.is_empty() && !d.entries.iter().any(|e| e == n) {
                    d.entries.push(n.to_string());
                }
            }
        } else if w == ".global" {
            // `.global [.align N] .TYPE NAME[COUNT] [= {...}];`
            let mut elem = 1u64;
            let mut toks = Vec::new();
            for t in words.by_ref() {
                toks.push(t);
                if t.ends_with(';') || t.contains('=') || toks.len() > 6 {
                    break;
                }
            }
            let mut name = None;
            for (i, t) in toks.iter().enumerate() {
                if *t == ".align" {
                    continue;
                }
                if i > 0 && toks[i - 1] == ".align" {
                    continue;
                }
                if let Some(ty) = t.strip_prefix('.') {
                    let bits: u64 = ty
                        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                        .parse()
                        .unwrap_or(8);
                    elem = (bits / 8).max(1);
                    continue;
                }
                name = Some(*t);
                break;
            }
            if let Some(n) = name {
                let base = ident(n);
                let count = n
                    .find('[')
                    .and_then(|i| n[i + 1..].split(']').next())
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(1);
                if !base.is_empty() {
                    d.globals.push((base.to_string(), elem * count.max(1)));
                }
            }
        }
    }
    d
}

/// Function symbols of an ELF64 cubin.
fn parse_elf(img: &[u8]) -> Option<Declared> {
    let rd16 = |o: usize| Some(u16::from_le_bytes(img.get(o..o + 2)?.try_into().ok()?) as usize);
    let rd32 = |o: usize| Some(u32::from_le_bytes(img.get(o..o + 4)?.try_into().ok()?) as usize);
    let rd64 = |o: usize| Some(u64::from_le_bytes(img.get(o..o + 8)?.try_into().ok()?) as usize);
    if img.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let shoff = rd64(0x28)?;
    let shentsize = rd16(0x3a)?;
    let shnum = rd16(0x3c)?;
    let mut d = Declared::default();
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        if rd32(sh + 4)? != 2 {
            continue; // SHT_SYMTAB
        }
        let (off, size, link, entsize) = (
            rd64(sh + 0x18)?,
            rd64(sh + 0x20)?,
            rd32(sh + 0x28)?,
            rd64(sh + 0x38)?.max(24),
        );
        let strsh = shoff + link * shentsize;
        let stroff = rd64(strsh + 0x18)?;
        for k in 0..size / entsize {
            let s = off + k * entsize;
            let info = *img.get(s + 4)?;
            let name_off = rd32(s)?;
            let start = stroff + name_off;
            let end = start + img.get(start..)?.iter().position(|&b| b == 0)?;
            let name = std::str::from_utf8(&img[start..end]).ok()?;
            match info & 0xf {
                2 if !name.is_empty() => d.entries.push(name.to_string()),
                1 if !name.is_empty() && !name.starts_with('.') => {
                    d.globals.push((name.to_string(), rd64(s + 16)? as u64))
                }
                _ => {}
            }
        }
    }
    Some(d)
}

/// Read what an image declares: PTX text, our linked image, an ELF cubin, or a fat binary
/// (its entries for the fake's device).
pub fn parse_image(img: &[u8]) -> CuResult<Declared> {
    if let Some(d) = parse_elf(img) {
        return Ok(d);
    }
    if img.len() >= 16 && img[..4] == FATBIN_MAGIC.to_le_bytes() {
        return read_entries(&fat_entries(img)?);
    }
    let text = String::from_utf8_lossy(img);
    let d = parse_ptx(&text);
    if !d.entries.is_empty() || !d.globals.is_empty() || text.contains(".version") {
        return Ok(d);
    }
    Err(CUDA_ERROR_INVALID_IMAGE)
}

/// The magic of a fat binary's header.
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The compute capability the fake's devices report, as a fat binary names architectures.
const DEVICE_ARCH: u32 = 90;
const ENTRY_PTX: u16 = 1;
const ENTRY_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

/// One fat-binary entry chosen for the device: its (possibly compressed) payload.
#[derive(Debug)]
pub struct FatEntry {
    kind: u16,
    flags: u64,
    decompressed: usize,
    payload: Vec<u8>,
}

/// The entries of a fat binary that the device would run, copied out of the image: every
/// cubin for sm_90, else the PTX of the newest architecture not above it. Only headers are
/// read here.
pub fn fat_entries(img: &[u8]) -> CuResult<Vec<FatEntry>> {
    let rd = |o: usize, n: usize| -> CuResult<u64> {
        let b = img.get(o..o + n).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    };
    if rd(0, 4)? != FATBIN_MAGIC as u64 {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let hsize = rd(6, 2)? as usize;
    let fsize = rd(8, 8)? as usize;
    let end = hsize.checked_add(fsize).ok_or(CUDA_ERROR_INVALID_IMAGE)?;
    if end > img.len() {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    // (kind, arch, flags, payload range, decompressed size)
    let mut all = Vec::new();
    let mut q = hsize;
    while q + 64 <= end {
        let kind = rd(q, 2)? as u16;
        let ehs = rd(q + 4, 4)? as usize;
        let esize = rd(q + 8, 8)? as usize;
        let csize = rd(q + 16, 4)? as usize;
        let arch = rd(q + 28, 4)? as u32;
        let flags = rd(q + 40, 8)?;
        let dsize = rd(q + 56, 8)? as usize;
        if ehs < 64 || q + ehs + esize > end {
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        let compressed = flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
        let len = if compressed && csize > 0 && csize <= esize {
            csize
        } else {
            esize
        };
        all.push((kind, arch, flags, q + ehs..q + ehs + len, dsize));
        q += ehs + esize;
    }
    let cubins: Vec<_> = all
        .iter()
        .filter(|e| e.0 == ENTRY_ELF && e.1 == DEVICE_ARCH)
        .collect();
    let chosen = if !cubins.is_empty() {
        cubins
    } else {
        let best = all
            .iter()
            .filter(|e| e.0 == ENTRY_PTX && e.1 <= DEVICE_ARCH)
            .map(|e| e.1)
            .max();
        let Some(best) = best else {
            return Err(if all.is_empty() {
                CUDA_ERROR_INVALID_IMAGE
            } else {
                CUDA_ERROR_NO_BINARY_FOR_GPU
            });
        };
        all.iter()
            .filter(|e| e.0 == ENTRY_PTX && e.1 == best)
            .collect()
    };
    Ok(chosen
        .into_iter()
        .map(|(kind, _, flags, r, dsize)| FatEntry {
            kind: *kind,
            flags: *flags,
            decompressed: *dsize,
            payload: img[r.clone()].to_vec(),
        })
        .collect())
}

/// An entry's bytes, decompressed.
fn entry_bytes(e: &FatEntry) -> CuResult<std::borrow::Cow<'_, [u8]>> {
    use std::borrow::Cow;
    if e.flags & FLAG_ZSTD != 0 {
        let mut out = Vec::with_capacity(e.decompressed);
        let mut dec = ruzstd::decoding::StreamingDecoder::new(&e.payload[..])
            .map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
        std::io::Read::read_to_end(&mut dec, &mut out).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
        Ok(Cow::Owned(out))
    } else if e.flags & FLAG_LZ4 != 0 {
        let mut out = vec![0u8; e.decompressed];
        let n = lz4_flex::block::decompress_into(&e.payload, &mut out)
            .map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
        out.truncate(n);
        Ok(Cow::Owned(out))
    } else {
        Ok(Cow::Borrowed(&e.payload))
    }
}

/// The names declared by the chosen entries of a fat binary.
fn read_entries(entries: &[FatEntry]) -> CuResult<Declared> {
    let mut all = Declared::default();
    for e in entries {
        let bytes = entry_bytes(e)?;
        let d = if e.kind == ENTRY_ELF {
            parse_elf(&bytes).ok_or(CUDA_ERROR_INVALID_IMAGE)?
        } else {
            parse_ptx(&String::from_utf8_lossy(&bytes))
        };
        all.entries.extend(d.entries);
        all.globals.extend(d.globals);
    }
    Ok(all)
}

/// Bytes of an image passed as a pointer: PTX is NUL-terminated text, an ELF knows its size,
/// a fat binary (`0xBA55ED50`) has a header with its size.
///
/// # Safety
/// `p` must point to a valid image.
pub unsafe fn image_bytes<'a>(p: *const u8) -> CuResult<&'a [u8]> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller guarantees a valid image; we read only the headers it must have.
    unsafe {
        let head = std::slice::from_raw_parts(p, 4);
        if head == b"\x7fELF" {
            let shoff = (p.add(0x28) as *const u64).read_unaligned() as usize;
            let shentsize = (p.add(0x3a) as *const u16).read_unaligned() as usize;
            let shnum = (p.add(0x3c) as *const u16).read_unaligned() as usize;
            return Ok(std::slice::from_raw_parts(p, shoff + shentsize * shnum));
        }
        if (p as *const u32).read_unaligned() == 0xBA55_ED50 {
            let hsize = (p.add(6) as *const u16).read_unaligned() as usize;
            let fsize = (p.add(8) as *const u64).read_unaligned() as usize;
            return Ok(std::slice::from_raw_parts(p, hsize + fsize));
        }
        // `fatBinaryWrapper` (magic 0x466243B1): points at the fat binary.
        if (p as *const u32).read_unaligned() == 0x4662_43B1 {
            let inner = (p.add(8) as *const *const u8).read_unaligned();
            return image_bytes(inner);
        }
        Ok(std::ffi::CStr::from_ptr(p as *const std::ffi::c_char).to_bytes())
    }
}

/// Load an image into `ctx` (or unbound, for a library). A fat binary's names are read at
/// the first lookup; any other image is read now. A library (`cuLibraryLoadData`) is not bound
/// to a device, so a fat binary with no code for this device loads, and its lookups fail with
/// `CUDA_ERROR_NO_BINARY_FOR_GPU` (libraries such as cuBLAS register one fat binary per
/// architecture); a module load fails at once.
pub fn load(ctx: Option<&'static Ctx>, img: &[u8]) -> CuResult<&'static Module> {
    load_as(ctx, img, false)
}

/// [`load`] for `cuLibraryLoad*`.
pub fn load_library(ctx: Option<&'static Ctx>, img: &[u8]) -> CuResult<&'static Module> {
    load_as(ctx, img, true)
}

fn load_as(ctx: Option<&'static Ctx>, img: &[u8], library: bool) -> CuResult<&'static Module> {
    let fat = parse_elf(img).is_none() && img.len() >= 16 && img[..4] == FATBIN_MAGIC.to_le_bytes();
    let mut deferred = None;
    let (pending, names) = if fat {
        match fat_entries(img) {
            Ok(e) => (e, None),
            Err(CUDA_ERROR_NO_BINARY_FOR_GPU) if library => {
                deferred = Some(CUDA_ERROR_NO_BINARY_FOR_GPU);
                (Vec::new(), None)
            }
            Err(e) => return Err(e),
        }
    } else {
        (Vec::new(), Some(parse_image(img)?))
    };
    let m: &'static Module = Box::leak(Box::new(Module {
        magic: MODULE_MAGIC,
        ctx,
        pending,
        names: OnceLock::new(),
        globals: Mutex::new(HashMap::new()),
    }));
    if let Some(d) = names {
        let _ = m.names.set(Ok(m.make_names(d)));
    }
    if let Some(e) = deferred {
        let _ = m.names.set(Err(e));
    }
    Ok(m)
}
impl Module {
    /// The module a handle names.
    pub fn resolve(h: *mut std::ffi::c_void) -> CuResult<&'static Module> {
        crate::runtime::rt()?;
        crate::handle::resolve(h).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUmodule {
        self as *const Module as CUmodule
    }

    fn make_names(&'static self, d: Declared) -> Names {
        let mid = self as *const Module as usize;
        let mut funcs = HashMap::new();
        for e in d.entries {
            let f: &'static Func = Box::leak(Box::new(Func {
                magic: FUNC_MAGIC,
                spin: e == "gpuslice_spin",
                name: e.clone(),
                module: mid,
            }));
            funcs.insert(e, f);
        }
        Names {
            funcs,
            global_sizes: d.globals.into_iter().collect(),
        }
    }

    /// Its names, read from the pending fat-binary entries on first use.
    fn names(&'static self) -> CuResult<&'static Names> {
        self.names
            .get_or_init(|| Ok(self.make_names(read_entries(&self.pending)?)))
            .as_ref()
            .map_err(|e| *e)
    }

    /// `cuModuleGetFunction`.
    pub fn function(&'static self, name: &str) -> CuResult<&'static Func> {
        self.names()?
            .funcs
            .get(name)
            .copied()
            .ok_or(CUDA_ERROR_NOT_FOUND)
    }

    /// `cuModuleGetGlobal`: a small backing buffer per global, made on first use.
    pub fn global(&'static self, name: &str) -> CuResult<(u64, u64)> {
        let size = *self
            .names()?
            .global_sizes
            .get(name)
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut g = self.globals.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&v) = g.get(name) {
            return Ok(v);
        }
        let p = mem::alloc_host(self.ctx, size, Kind::Global)?;
        g.insert(name.to_string(), (p, size));
        Ok((p, size))
    }

    /// Kernel names, for cuLibraryEnumerateKernels-like queries.
    pub fn kernel_count(&'static self) -> CuResult<usize> {
        Ok(self.names()?.funcs.len())
    }
}

impl Func {
    /// The function a CUfunction or CUkernel handle names.
    pub fn resolve(h: *mut std::ffi::c_void) -> CuResult<&'static Func> {
        crate::handle::resolve(h).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Its handle.
    pub fn handle(&'static self) -> CUfunction {
        self as *const Func as CUfunction
    }
}

/// A JIT link in progress: the PTX (or images) added so far, and the result once complete.
pub struct Link {
    parts: Vec<u8>,
    out: Vec<u8>,
}

/// `cuLinkCreate`.
pub fn link_create() -> &'static mut Link {
    let mut parts = Vec::new();
    parts.extend_from_slice(LINKED_MAGIC);
    Box::leak(Box::new(Link {
        parts,
        out: Vec::new(),
    }))
}

/// `CUjitInputType` values that are libraries or objects we only accept.
const CU_JIT_INPUT_LIBRARY: u32 = 4;

impl Link {
    /// `cuLinkAddData`: PTX and images are kept; libraries are accepted and ignored.
    pub fn add(&mut self, ty: u32, data: &[u8]) -> CuResult<()> {
        if ty == CU_JIT_INPUT_LIBRARY {
            return Ok(());
        }
        let d = parse_image(data)?;
        for e in d.entries {
            self.parts
                .extend_from_slice(format!("\n.entry {e} (\n").as_bytes());
        }
        for (g, size) in d.globals {
            self.parts
                .extend_from_slice(format!("\n.global .b8 {g}[{size}];\n").as_bytes());
        }
        Ok(())
    }

    /// `cuLinkComplete`: the image, valid until `cuLinkDestroy`.
    pub fn complete(&mut self) -> (&[u8], usize) {
        self.out = self.parts.clone();
        self.out.push(0);
        (&self.out, self.out.len())
    }
}
