//! Finds libzerod and zerod.h, in this order: ZEROD_LIB_DIR / ZEROD_INCLUDE_DIR,
//! an installed zerod (pkg-config), the build tree of this checkout.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for var in ["ZEROD_LIB_DIR", "ZEROD_INCLUDE_DIR", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");

    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let tree = manifest.join("..").join("..");

    let lib_dir = from_env("ZEROD_LIB_DIR")
        .or_else(|| pkg_config_variable("libdir"))
        .unwrap_or_else(|| tree.join("build").join("lib"));
    let include_dir = from_env("ZEROD_INCLUDE_DIR")
        .or_else(|| pkg_config_variable("includedir"))
        .unwrap_or_else(|| tree.join("include"));
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    let include_dir = include_dir.canonicalize().unwrap_or(include_dir);

    if !lib_dir.join("libzerod.so").exists() {
        println!(
            "cargo:warning=no libzerod.so in {}: build zerod first (cmake --preset default && ninja -C build) or set ZEROD_LIB_DIR",
            lib_dir.display()
        );
    }
    println!(
        "cargo:rerun-if-changed={}",
        include_dir.join("zerod").join("zerod.h").display()
    );

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=zerod");
    // The rpath lets `cargo test` run without LD_LIBRARY_PATH. It reaches only
    // this package's own binaries (tests, doctests); dependents read lib_dir
    // back as DEP_ZEROD_LIB_DIR and set their own.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:include_dir={}", include_dir.display());
    // The layout test compiles a C program against the same header.
    println!("cargo:rustc-env=ZEROD_HEADER_DIR={}", include_dir.display());
}

fn from_env(var: &str) -> Option<PathBuf> {
    env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A variable of the installed zerod.pc, or None when pkg-config or the
/// package is missing.
fn pkg_config_variable(name: &str) -> Option<PathBuf> {
    let out = Command::new("pkg-config")
        .arg(format!("--variable={}", name))
        .arg("zerod")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let value = String::from_utf8(out.stdout).ok()?;
    let value = value.trim();
    if value.is_empty() || !Path::new(value).is_dir() {
        return None;
    }
    Some(PathBuf::from(value))
}
