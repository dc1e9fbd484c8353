//! The zerod crate's build script found libzerod; an rpath to the same
//! directory lets the trainer run without LD_LIBRARY_PATH (cargo passes link
//! arguments only to the package that asks for them).

fn main() {
    if let Some(dir) = std::env::var_os("DEP_ZEROD_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.to_string_lossy());
    }
    println!("cargo:rerun-if-env-changed=DEP_ZEROD_LIB_DIR");
}
