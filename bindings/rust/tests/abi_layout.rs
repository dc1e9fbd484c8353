//! The FFI cannot drift from zerod.h.
//!
//! The C side's truth comes from the C compiler: this test reads the header
//! for the names of its structs, fields and constants, writes a C program
//! that includes it and prints sizeof, _Alignof, offsetof, each field's size,
//! the bytes of each ZD_*_INIT macro and each constant's value, compiles it
//! with the system `cc` and runs it. The Rust side's comes from rustc (the
//! tables below). Signatures and field types are compared as text, C types
//! mapped to Rust ones (`const char**` is `*mut *const c_char`), since the
//! compiler cannot compare them across languages.
//!
//! A header change the crate did not follow fails here: a new or moved
//! field, a changed constant, a new call, a changed signature.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::mem::{align_of, size_of, MaybeUninit};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::addr_of;
use std::sync::atomic::{AtomicUsize, Ordering};

use zerod::ffi;

// ---------------------------------------------------------------------------
// The Rust side, from rustc
// ---------------------------------------------------------------------------

struct RustStruct {
    name: &'static str,
    size: usize,
    align: usize,
    /// name, offset, size, the bytes of the field in `Default::default()`
    fields: Vec<(&'static str, usize, usize, Vec<u8>)>,
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

/// The layout of a mirror struct. The pattern in `_every_field` lists the
/// fields without `..`, so a field added to the mirror and not here does not
/// compile.
macro_rules! layout {
    ($t:ident { $($f:ident),* $(,)? }) => {{
        #[allow(dead_code)]
        fn _every_field(v: ffi::$t) {
            let ffi::$t { $($f: _),* } = v;
        }
        let uninit = MaybeUninit::<ffi::$t>::uninit();
        let base = uninit.as_ptr();
        let init = ffi::$t::default();
        RustStruct {
            name: stringify!($t),
            size: size_of::<ffi::$t>(),
            align: align_of::<ffi::$t>(),
            fields: vec![$({
                // SAFETY: addr_of! makes no reference to the uninitialised
                // value; the bytes read are those of an initialised field.
                let (offset, size, bytes) = unsafe {
                    let field = addr_of!((*base).$f);
                    let size = size_of_pointee(field);
                    let bytes = std::slice::from_raw_parts(addr_of!(init.$f) as *const u8, size).to_vec();
                    ((field as *const u8).offset_from(base as *const u8) as usize, size, bytes)
                };
                (stringify!($f), offset, size, bytes)
            }),*],
        }
    }};
}

fn rust_structs() -> Vec<RustStruct> {
    vec![
        layout!(zd_connect_options {
            struct_size,
            abi_version,
            timeout_ms,
            reserved
        }),
        layout!(zd_client_info {
            struct_size,
            rank,
            world_size,
            local_rank,
            embedded
        }),
        layout!(zd_model_options {
            struct_size,
            flags,
            script_path,
            script_text,
            script_name,
            device
        }),
        layout!(zd_param_desc {
            struct_size,
            dtype,
            name,
            module,
            ndim,
            shape,
            init,
            init_dtype
        }),
        layout!(zd_param_info {
            struct_size,
            dtype,
            name,
            module,
            ndim,
            shape,
            numel
        }),
        layout!(zd_view {
            struct_size,
            flags,
            data,
            nbytes,
            dtype,
            ndim,
            shape,
            device_type,
            device_id,
            arena,
            reserved,
            offset
        }),
        layout!(zd_step_result {
            struct_size,
            flags,
            step,
            micro_step,
            lr,
            loss_scale,
            grad_norm
        }),
        layout!(zd_memory_figures {
            struct_size,
            reserved,
            current,
            peak,
            budget
        }),
        layout!(zd_optimizer_info {
            struct_size,
            state_slots,
            step,
            name,
            slot_names
        }),
        layout!(zd_comm_figures {
            struct_size,
            reserved,
            bytes_sent,
            network_bytes_sent,
            collectives
        }),
        layout!(zd_progress {
            struct_size,
            flags,
            tokens,
            samples,
            loss,
            reserved
        }),
    ]
}

macro_rules! constants {
    ($($c:ident),* $(,)?) => { vec![$((stringify!($c), ffi::$c as i64)),*] };
}

fn rust_constants() -> Vec<(&'static str, i64)> {
    constants![
        ZD_ABI_VERSION_MAJOR,
        ZD_ABI_VERSION_MINOR,
        ZD_ABI_VERSION,
        ZD_OK,
        ZD_ERR_INVALID_ARGUMENT,
        ZD_ERR_INVALID_STATE,
        ZD_ERR_NOT_FOUND,
        ZD_ERR_SHAPE_MISMATCH,
        ZD_ERR_CONFIG,
        ZD_ERR_PLUGIN,
        ZD_ERR_OUT_OF_MEMORY,
        ZD_ERR_BUDGET,
        ZD_ERR_IO,
        ZD_ERR_NOT_IMPLEMENTED,
        ZD_ERR_VERSION,
        ZD_ERR_PEER_LOST,
        ZD_ERR_TIMEOUT,
        ZD_ERR_BUFFER_TOO_SMALL,
        ZD_ERR_INTERNAL,
        ZD_DTYPE_F32,
        ZD_DTYPE_BF16,
        ZD_DTYPE_F16,
        ZD_TIER_DEVICE,
        ZD_TIER_HOST,
        ZD_TIER_NVME,
        ZD_TIER_COUNT,
        ZD_MEM_ALL,
        ZD_MEM_PARAMS,
        ZD_MEM_GRADS,
        ZD_MEM_MASTER,
        ZD_MEM_OPTIMIZER,
        ZD_MEM_BUFFERS,
        ZD_MEM_KIND_COUNT,
        ZD_MODEL_ALLOW_SCRIPT_IO,
        ZD_MAX_DIMS,
        ZD_MAX_STATE_SLOTS,
        ZD_VIEW_READ_ONLY,
        ZD_DEVICE_CPU,
        ZD_DEVICE_CUDA,
        ZD_STEP_BOUNDARY,
        ZD_STEP_APPLIED,
        ZD_STEP_SKIPPED,
        ZD_PROGRESS_HAS_LOSS,
    ]
}

// ---------------------------------------------------------------------------
// The header, as text
// ---------------------------------------------------------------------------

/// A declaration's type as a Rust type would spell it, without spaces:
/// `*const c_char`, `[i64; ZD_MAX_DIMS]`, `()`.
type RType = String;

#[derive(Default)]
struct Header {
    handles: BTreeSet<String>,
    typedefs: BTreeMap<String, RType>,
    /// name -> fields in order (name, type)
    structs: BTreeMap<String, Vec<(String, RType)>>,
    constants: BTreeSet<String>,
    /// name -> (parameter types, return type)
    functions: BTreeMap<String, (Vec<RType>, RType)>,
}

fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*").into_iter().chain(rest.find("//")).min() {
        out.push_str(&rest[..i]);
        rest = if rest[i..].starts_with("/*") {
            &rest[i + rest[i..].find("*/").expect("unterminated comment") + 2..]
        } else {
            &rest[i + rest[i..].find('\n').unwrap_or(rest.len() - i)..]
        };
    }
    out.push_str(rest);
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `type name` or `type name[N]` into the Rust spelling of the type
/// and the name.
fn c_decl(decl: &str) -> (RType, String) {
    let decl = decl.trim();
    let (decl, array) = match decl.find('[') {
        Some(i) => (
            &decl[..i],
            Some(decl[i + 1..decl.len() - 1].trim().to_string()),
        ),
        None => (decl, None),
    };
    let decl = decl.trim_end();
    let split = decl.len() - decl.chars().rev().take_while(|&c| is_ident_char(c)).count();
    let (ty, name) = (&decl[..split], &decl[split..]);
    let ty = c_type(ty);
    let ty = match array {
        Some(n) => format!("[{};{}]", ty, n),
        None => ty,
    };
    (ty, name.to_string())
}

/// `const char**` -> `*mut*constc_char` (spaces dropped, as in `squash`).
fn c_type(ty: &str) -> RType {
    let spaced = ty.replace('*', " * ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    // pointee_const[i]: whether what pointer level i points at is const.
    let mut base = None;
    let mut base_const = false;
    let mut pointee_const = Vec::new();
    let mut after_star_const = false;
    for t in tokens {
        match t {
            "const" if pointee_const.is_empty() => base_const = true,
            "const" => after_star_const = true,
            "*" => {
                let c = if pointee_const.is_empty() {
                    base_const
                } else {
                    after_star_const
                };
                pointee_const.push(c);
                after_star_const = false;
            }
            other => base = Some(other),
        }
    }
    let base = match base.expect("a C type names a base type") {
        "char" => "c_char",
        "void" if pointee_const.is_empty() => "()",
        "void" => "c_void",
        "uint32_t" => "u32",
        "int32_t" => "i32",
        "uint64_t" => "u64",
        "int64_t" => "i64",
        "double" => "f64",
        "float" => "f32",
        "size_t" => "usize",
        other => other,
    };
    let mut out = String::new();
    for c in pointee_const.iter().rev() {
        out.push_str(if *c { "*const" } else { "*mut" });
    }
    out.push_str(base);
    out
}

fn squash(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

fn parse_header(text: &str) -> Header {
    let text = strip_c_comments(text);
    let mut h = Header::default();
    let mut code = String::new();
    let mut in_cplusplus = false;
    for line in text.lines() {
        let line = line.trim();
        // `extern "C" {` and its brace are C++ only.
        if line.starts_with("#ifdef __cplusplus") {
            in_cplusplus = true;
        } else if in_cplusplus {
            in_cplusplus = !line.starts_with("#endif");
        } else if let Some(def) = line.strip_prefix("#define ") {
            let name: String = def.chars().take_while(|&c| is_ident_char(c)).collect();
            if name.starts_with("ZD_") && !name.ends_with("_INIT") && name != "ZD_API" {
                h.constants.insert(name);
            }
        } else if !line.starts_with('#') {
            code.push_str(line);
            code.push('\n');
        }
    }
    // Statements end at ';' (a struct body's fields too, handled below).
    let mut rest = code.as_str();
    while let Some(end) = rest.find(';') {
        let mut stmt = rest[..end].trim().to_string();
        rest = &rest[end + 1..];
        if stmt.starts_with("typedef struct") && stmt.contains('{') {
            // typedef struct NAME { fields; } NAME;  -- read to the closing brace.
            let close = rest.find('}').expect("struct body closes");
            stmt.push(';');
            stmt.push_str(&rest[..close]);
            let after = &rest[close + 1..];
            let semi = after.find(';').expect("typedef ends");
            let name = after[..semi].trim().to_string();
            rest = &after[semi + 1..];
            let body = &stmt[stmt.find('{').unwrap() + 1..];
            let fields = body
                .split(';')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(|f| {
                    let (ty, field) = c_decl(f);
                    (field, ty)
                });
            h.structs.insert(name, fields.collect());
        } else if let Some(t) = stmt.strip_prefix("typedef struct ") {
            h.handles
                .insert(t.split_whitespace().last().unwrap().to_string());
        } else if let Some(t) = stmt.strip_prefix("typedef ") {
            let (ty, name) = c_decl(t);
            h.typedefs.insert(name, ty);
        } else if stmt.starts_with("enum") {
            // `enum { A = 1, B = 2 }`: the statement ends at the `;` after `}`.
            let body = stmt
                .trim_start_matches("enum")
                .trim()
                .trim_start_matches('{');
            let body = &body[..body.find('}').unwrap_or(body.len())];
            for entry in body.split(',') {
                let name: String = entry
                    .trim()
                    .chars()
                    .take_while(|&c| is_ident_char(c))
                    .collect();
                if !name.is_empty() {
                    h.constants.insert(name);
                }
            }
        } else if let Some(decl) = stmt.strip_prefix("ZD_API ") {
            let open = decl.find('(').expect("a function has parameters");
            let (ret, name) = c_decl(&decl[..open]);
            let params = decl[open + 1..decl.rfind(')').unwrap()].trim();
            let params = if params == "void" {
                Vec::new()
            } else {
                params.split(',').map(|p| c_decl(p).0).collect()
            };
            h.functions.insert(name, (params, ret));
        }
    }
    h
}

// ---------------------------------------------------------------------------
// ffi.rs, as text
// ---------------------------------------------------------------------------

#[derive(Default)]
struct RustSource {
    structs: BTreeMap<String, Vec<(String, RType)>>,
    typedefs: BTreeMap<String, RType>,
    constants: BTreeSet<String>,
    functions: BTreeMap<String, (Vec<RType>, RType)>,
}

fn parse_rust(text: &str) -> RustSource {
    let text: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut r = RustSource::default();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("pub ") {
        rest = &rest[i + 4..];
        if let Some(s) = rest.strip_prefix("struct ") {
            let name: String = s.chars().take_while(|&c| is_ident_char(c)).collect();
            let close = s.find('}').unwrap();
            let body = &s[s.find('{').unwrap() + 1..close];
            let fields: Vec<(String, RType)> = body
                .split(",\n")
                .map(str::trim)
                .filter_map(|f| f.strip_prefix("pub "))
                .map(|f| {
                    let (n, t) = f.split_once(':').unwrap();
                    (n.trim().to_string(), squash(t.trim_end_matches(',')))
                })
                .collect();
            r.structs.insert(name, fields);
            rest = &s[close..];
        } else if let Some(s) = rest.strip_prefix("type ") {
            let (name, ty) = s[..s.find(';').unwrap()].split_once('=').unwrap();
            r.typedefs.insert(name.trim().to_string(), squash(ty));
        } else if let Some(s) = rest.strip_prefix("const ") {
            let name: String = s.chars().take_while(|&c| is_ident_char(c)).collect();
            r.constants.insert(name);
        } else if let Some(s) = rest.strip_prefix("fn ") {
            let decl = &s[..s.find(';').unwrap()];
            let name: String = decl.chars().take_while(|&c| is_ident_char(c)).collect();
            let close = decl.rfind(')').unwrap();
            let params = decl[decl.find('(').unwrap() + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| squash(p.split_once(':').unwrap().1))
                .collect();
            let ret = match decl[close + 1..].trim().strip_prefix("->") {
                Some(t) => squash(t),
                None => "()".to_string(),
            };
            r.functions.insert(name, (params, ret));
        }
    }
    r
}

// ---------------------------------------------------------------------------
// The C side, from the C compiler
// ---------------------------------------------------------------------------

#[derive(Default)]
struct CLayout {
    /// struct -> (size, align)
    structs: BTreeMap<String, (usize, usize)>,
    /// (struct, field) -> (offset, size, INIT macro bytes)
    fields: BTreeMap<(String, String), (usize, usize, Vec<u8>)>,
    constants: BTreeMap<String, i64>,
}

fn header_dir() -> PathBuf {
    PathBuf::from(env!("ZEROD_HEADER_DIR"))
}

fn c_program(h: &Header) -> String {
    let mut c = String::from(
        "#include <zerod/zerod.h>\n#include <stddef.h>\n#include <stdio.h>\n\n\
         static void bytes(const char* s, const char* f, const void* p, size_t n) {\n\
         \x20 printf(\"init %s %s \", s, f);\n\
         \x20 for (size_t i = 0; i < n; ++i) printf(\"%02x\", ((const unsigned char*)p)[i]);\n\
         \x20 printf(\"\\n\");\n}\n\nint main(void) {\n",
    );
    for (s, fields) in &h.structs {
        let init = format!("ZD_{}_INIT", s.trim_start_matches("zd_").to_uppercase());
        writeln!(c, "  {{\n    static const {s} init = {init};").unwrap();
        writeln!(
            c,
            "    printf(\"struct {s} %zu %zu\\n\", sizeof({s}), _Alignof({s}));"
        )
        .unwrap();
        for (f, _) in fields {
            writeln!(
                c,
                "    printf(\"field {s} {f} %zu %zu\\n\", offsetof({s}, {f}), sizeof(init.{f}));"
            )
            .unwrap();
            writeln!(
                c,
                "    bytes(\"{s}\", \"{f}\", &init.{f}, sizeof(init.{f}));"
            )
            .unwrap();
        }
        c.push_str("  }\n");
    }
    for k in &h.constants {
        writeln!(c, "  printf(\"const {k} %lld\\n\", (long long)({k}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

fn run_c_program(source: &str) -> CLayout {
    // Tests run in parallel; each compiles its own copy.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::SeqCst);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "abi_layout.{}.{}",
        std::process::id(),
        run
    ));
    fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    fs::write(&src, source).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{}`: {}", cc, e));
    assert!(
        out.status.success(),
        "{} failed on {}:\n{}",
        cc,
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    fs::remove_dir_all(&dir).ok();
    let mut l = CLayout::default();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let w: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| w[i].parse::<usize>().unwrap();
        match w[0] {
            "struct" => drop(l.structs.insert(w[1].into(), (num(2), num(3)))),
            "field" => drop(
                l.fields
                    .insert((w[1].into(), w[2].into()), (num(3), num(4), Vec::new())),
            ),
            "init" => {
                let hex = w.get(3).copied().unwrap_or("");
                let b = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap());
                l.fields.get_mut(&(w[1].into(), w[2].into())).unwrap().2 = b.collect();
            }
            "const" => drop(l.constants.insert(w[1].into(), w[2].parse().unwrap())),
            _ => panic!("unexpected line from the layout program: {}", line),
        }
    }
    l
}

// ---------------------------------------------------------------------------
// The comparison
// ---------------------------------------------------------------------------

fn names<'a, V>(m: impl IntoIterator<Item = (&'a String, V)>) -> BTreeSet<String> {
    m.into_iter().map(|(k, _)| k.clone()).collect()
}

fn same_sets(
    what: &str,
    header: &BTreeSet<String>,
    rust: &BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    for n in header.difference(rust) {
        problems.push(format!(
            "{} `{}` is in zerod.h but not in the crate",
            what, n
        ));
    }
    for n in rust.difference(header) {
        problems.push(format!(
            "{} `{}` is in the crate but not in zerod.h",
            what, n
        ));
    }
}

fn load() -> (Header, RustSource, CLayout) {
    let header_path = header_dir().join("zerod").join("zerod.h");
    let header = parse_header(&fs::read_to_string(&header_path).expect("read zerod.h"));
    let ffi_rs = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("ffi.rs");
    let rust = parse_rust(&fs::read_to_string(ffi_rs).expect("read ffi.rs"));
    let c = run_c_program(&c_program(&header));
    (header, rust, c)
}

fn report(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "the crate does not match zerod.h ({}):\n  {}",
        header_dir().display(),
        problems.join("\n  ")
    );
}

#[test]
fn the_header_is_read_completely() {
    // A parser that silently found nothing would make every other test pass.
    let (h, _, c) = load();
    assert!(h.structs.len() >= 8, "{:?}", h.structs.keys());
    assert_eq!(
        h.handles,
        ["zd_client", "zd_model"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(h.functions.len() >= 29, "{:?}", h.functions.keys());
    assert!(h.constants.contains("ZD_ERR_INTERNAL") && h.constants.contains("ZD_STEP_SKIPPED"));
    assert_eq!(c.constants.len(), h.constants.len());
    assert_eq!(h.typedefs["zd_status"], "i32");
}

#[test]
fn struct_layouts_match() {
    let (h, rust, c) = load();
    let mut problems = Vec::new();
    let table = rust_structs();
    let table_names: BTreeSet<String> = table.iter().map(|s| s.name.to_string()).collect();
    same_sets("struct", &names(&h.structs), &table_names, &mut problems);
    let rust_defined: BTreeSet<String> = names(&rust.structs)
        .difference(&h.handles)
        .cloned()
        .collect();
    same_sets(
        "struct (in ffi.rs)",
        &names(&h.structs),
        &rust_defined,
        &mut problems,
    );
    for s in &table {
        let (size, align) = match c.structs.get(s.name) {
            Some(&v) => v,
            None => continue,
        };
        if (s.size, s.align) != (size, align) {
            problems.push(format!(
                "{}: C has size {} align {}, Rust size {} align {}",
                s.name, size, align, s.size, s.align
            ));
        }
        let c_fields: Vec<String> = h.structs[s.name].iter().map(|(f, _)| f.clone()).collect();
        let r_fields: Vec<String> = s.fields.iter().map(|(f, ..)| f.to_string()).collect();
        if c_fields != r_fields {
            problems.push(format!(
                "{}: C fields {:?}, Rust fields {:?}",
                s.name, c_fields, r_fields
            ));
            continue;
        }
        for (f, offset, fsize, init) in &s.fields {
            let (c_offset, c_size, c_init) = &c.fields[&(s.name.to_string(), f.to_string())];
            if (offset, fsize) != (c_offset, c_size) {
                problems.push(format!(
                    "{}.{}: C offset {} size {}, Rust offset {} size {}",
                    s.name, f, c_offset, c_size, offset, fsize
                ));
            } else if init != c_init {
                problems.push(format!(
                    "{}.{}: {} gives bytes {:?}, Default gives {:?}",
                    s.name, f, "the _INIT macro", c_init, init
                ));
            }
        }
    }
    report(problems);
}

#[test]
fn field_types_match() {
    let (h, rust, _) = load();
    let mut problems = Vec::new();
    for (s, fields) in &h.structs {
        let r = match rust.structs.get(s) {
            Some(r) => r,
            None => continue, // reported by struct_layouts_match
        };
        if fields.len() != r.len() {
            problems.push(format!(
                "{}: C has {} fields, ffi.rs {}",
                s,
                fields.len(),
                r.len()
            ));
        }
        for ((f, c_ty), (rf, r_ty)) in fields.iter().zip(r) {
            if f != rf || c_ty != r_ty {
                problems.push(format!(
                    "{}.{}: C `{}`, Rust `{}: {}`",
                    s, f, c_ty, rf, r_ty
                ));
            }
        }
    }
    for (name, c_ty) in &h.typedefs {
        match rust.typedefs.get(name) {
            Some(r) if r == c_ty => {}
            other => problems.push(format!("typedef {}: C `{}`, Rust {:?}", name, c_ty, other)),
        }
    }
    same_sets(
        "typedef",
        &names(&h.typedefs),
        &names(&rust.typedefs),
        &mut problems,
    );
    report(problems);
}

#[test]
fn constants_match() {
    let (h, rust, c) = load();
    let mut problems = Vec::new();
    let table: BTreeMap<String, i64> = rust_constants()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    same_sets("constant", &h.constants, &names(&table), &mut problems);
    same_sets(
        "constant (in ffi.rs)",
        &h.constants,
        &rust.constants,
        &mut problems,
    );
    for (k, v) in &table {
        if let Some(cv) = c.constants.get(k) {
            if cv != v {
                problems.push(format!("{}: C {}, Rust {}", k, cv, v));
            }
        }
    }
    report(problems);
}

#[test]
fn function_signatures_match() {
    let (h, rust, _) = load();
    let mut problems = Vec::new();
    same_sets(
        "function",
        &names(&h.functions),
        &names(&rust.functions),
        &mut problems,
    );
    for (name, (params, ret)) in &h.functions {
        if let Some((r_params, r_ret)) = rust.functions.get(name) {
            if params != r_params || ret != r_ret {
                problems.push(format!(
                    "{}: C ({}) -> {}, Rust ({}) -> {}",
                    name,
                    params.join(", "),
                    ret,
                    r_params.join(", "),
                    r_ret
                ));
            }
        }
    }
    report(problems);
}

#[test]
fn the_c_to_rust_type_mapping() {
    assert_eq!(c_type("const char*"), "*constc_char");
    assert_eq!(c_type("const char**"), "*mut*constc_char");
    assert_eq!(c_type("zd_client**"), "*mut*mutzd_client");
    assert_eq!(c_type("const void*"), "*constc_void");
    assert_eq!(c_type("void"), "()");
    assert_eq!(
        c_decl("int64_t shape[ZD_MAX_DIMS]"),
        ("[i64;ZD_MAX_DIMS]".to_string(), "shape".to_string())
    );
    assert_eq!(
        c_decl("const zd_model* model"),
        ("*constzd_model".to_string(), "model".to_string())
    );
}
