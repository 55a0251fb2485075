//! The C interface OpenSSH's `ssh-sk-helper` loads: `sk_api_version`,
//! `sk_enroll`, `sk_sign` and `sk_load_resident_keys`, with the structures
//! of `sk-api.h` version 0x000a0000 (written from their documented layout).
//! Every buffer handed to OpenSSH is allocated with the C allocator, which
//! OpenSSH frees with `free()`.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::{Algorithm, Error};

/// `struct sk_enroll_response`.
#[repr(C)]
pub struct SkEnrollResponse {
    flags: u8,
    public_key: *mut u8,
    public_key_len: usize,
    key_handle: *mut u8,
    key_handle_len: usize,
    signature: *mut u8,
    signature_len: usize,
    attestation_cert: *mut u8,
    attestation_cert_len: usize,
    authdata: *mut u8,
    authdata_len: usize,
}

/// `struct sk_sign_response`.
#[repr(C)]
pub struct SkSignResponse {
    flags: u8,
    counter: u32,
    sig_r: *mut u8,
    sig_r_len: usize,
    sig_s: *mut u8,
    sig_s_len: usize,
}

/// A copy of `bytes` in C memory (never null, even when empty), and its
/// length; `None` when memory is short.
fn c_copy(bytes: &[u8]) -> Option<(*mut u8, usize)> {
    // SAFETY: malloc with a non-zero size; the result is checked for null.
    let ptr = unsafe { libc::malloc(bytes.len().max(1)) } as *mut u8;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: ptr has room for bytes.len() bytes and does not overlap bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
    Some((ptr, bytes.len()))
}

/// A zeroed C allocation for one `T`, or null.
fn c_zeroed<T>() -> *mut T {
    // SAFETY: calloc of one element of T's size; null is handled by callers.
    unsafe { libc::calloc(1, std::mem::size_of::<T>()) as *mut T }
}

/// `len` bytes at `ptr` (none when `len` is 0, whatever `ptr` is).
///
/// # Safety
/// When `len` is not 0, `ptr` must point to `len` readable bytes that
/// outlive the slice.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    match (ptr.is_null(), len) {
        (_, 0) => Some(&[]),
        (true, _) => None,
        // SAFETY: the caller's promise.
        (false, _) => Some(unsafe { std::slice::from_raw_parts(ptr, len) }),
    }
}

/// The environment variable `name`, if set and UTF-8.
fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Returns the middleware interface version.
#[no_mangle]
pub extern "C" fn sk_api_version() -> u32 {
    crate::API_VERSION
}

/// Makes a key (`ssh-keygen -t ed25519-sk -w LIB`).
///
/// # Safety
/// Called by OpenSSH with the arguments `sk-api.h` describes:
/// `enroll_response` points to where the response goes.
#[no_mangle]
pub unsafe extern "C" fn sk_enroll(
    alg: u32,
    _challenge: *const u8,
    _challenge_len: usize,
    _application: *const c_char,
    flags: u8,
    _pin: *const c_char,
    _options: *mut *mut c_void,
    enroll_response: *mut *mut SkEnrollResponse,
) -> c_int {
    if enroll_response.is_null() {
        return Error::General.code();
    }
    let Some(alg) = Algorithm::from_code(alg) else {
        return Error::Unsupported.code();
    };
    let key = match crate::enroll(alg) {
        Ok(k) => k,
        Err(e) => return e.code(),
    };
    let response = c_zeroed::<SkEnrollResponse>();
    if response.is_null() {
        return Error::General.code();
    }
    let (Some(public_key), Some(key_handle)) = (c_copy(&key.public_key), c_copy(&key.key_handle))
    else {
        // SAFETY: response came from calloc; the fields still null or set
        // by c_copy are C allocations too (free(NULL) is fine).
        unsafe { free_enroll(response) };
        return Error::General.code();
    };
    // SAFETY: response is a live, zeroed allocation of the right size.
    unsafe {
        // The key keeps the flags it was asked for (presence, verification,
        // resident): they go into the key file.
        (*response).flags = flags;
        ((*response).public_key, (*response).public_key_len) = public_key;
        ((*response).key_handle, (*response).key_handle_len) = key_handle;
        *enroll_response = response;
    }
    0
}

/// Frees a partly filled enrollment response.
///
/// # Safety
/// `response` comes from `c_zeroed`, its pointers are null or C allocations.
unsafe fn free_enroll(response: *mut SkEnrollResponse) {
    // SAFETY: the caller's promise.
    unsafe {
        libc::free((*response).public_key as *mut c_void);
        libc::free((*response).key_handle as *mut c_void);
        libc::free(response as *mut c_void);
    }
}

/// Signs (for `ssh`, `ssh-agent`'s helper, `ssh-keygen -Y sign`).
///
/// # Safety
/// Called by OpenSSH with the arguments `sk-api.h` describes: `data` and
/// `key_handle` point to their lengths in bytes, `application` is a C
/// string, `sign_response` points to where the response goes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn sk_sign(
    alg: u32,
    data: *const u8,
    data_len: usize,
    application: *const c_char,
    key_handle: *const u8,
    key_handle_len: usize,
    flags: u8,
    _pin: *const c_char,
    _options: *mut *mut c_void,
    sign_response: *mut *mut SkSignResponse,
) -> c_int {
    if sign_response.is_null() || application.is_null() {
        return Error::General.code();
    }
    let Some(alg) = Algorithm::from_code(alg) else {
        return Error::Unsupported.code();
    };
    // SAFETY: OpenSSH passes buffers of the lengths it gives, and a C
    // string for the application.
    let (data, key_handle, application) = unsafe {
        (
            bytes(data, data_len),
            bytes(key_handle, key_handle_len),
            CStr::from_ptr(application).to_bytes(),
        )
    };
    let (Some(data), Some(key_handle)) = (data, key_handle) else {
        return Error::General.code();
    };
    let reported = match crate::flags(flags, setting(crate::FLAGS_VAR).as_deref()) {
        Ok(f) => f,
        Err(e) => return e.code(),
    };
    let counter = match crate::counter(setting(crate::COUNTER_VAR).as_deref()) {
        Ok(c) => c,
        Err(e) => return e.code(),
    };
    let signed = match crate::sign(alg, data, application, key_handle, reported, counter) {
        Ok(s) => s,
        Err(e) => return e.code(),
    };
    if let Some(path) = setting(crate::LOG_VAR) {
        use std::io::Write as _;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(crate::log_line(&signed).as_bytes()));
        if appended.is_err() {
            return Error::General.code();
        }
    }
    let response = c_zeroed::<SkSignResponse>();
    if response.is_null() {
        return Error::General.code();
    }
    let sig_r = c_copy(&signed.sig_r);
    // Ed25519 has no `s`: the field stays null.
    let sig_s = match signed.sig_s.is_empty() {
        true => Some((std::ptr::null_mut(), 0)),
        false => c_copy(&signed.sig_s),
    };
    let (Some(sig_r), Some(sig_s)) = (sig_r, sig_s) else {
        // SAFETY: C allocations (or null) made above.
        unsafe {
            libc::free(sig_r.map_or(std::ptr::null_mut(), |r| r.0) as *mut c_void);
            libc::free(response as *mut c_void);
        }
        return Error::General.code();
    };
    // SAFETY: response is a live, zeroed allocation of the right size.
    unsafe {
        (*response).flags = signed.flags;
        (*response).counter = signed.counter;
        ((*response).sig_r, (*response).sig_r_len) = sig_r;
        ((*response).sig_s, (*response).sig_s_len) = sig_s;
        *sign_response = response;
    }
    0
}

/// Lists the keys kept on the authenticator: there are none.
///
/// # Safety
/// `rks` and `nrks` point to where the list and its length go.
#[no_mangle]
pub unsafe extern "C" fn sk_load_resident_keys(
    _pin: *const c_char,
    _options: *mut *mut c_void,
    rks: *mut *mut *mut c_void,
    nrks: *mut usize,
) -> c_int {
    if rks.is_null() || nrks.is_null() {
        return Error::General.code();
    }
    // SAFETY: both point to writable locations (checked non-null above).
    unsafe {
        *rks = std::ptr::null_mut();
        *nrks = 0;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enroll_and_sign_through_the_c_interface() {
        assert_eq!(sk_api_version() & 0xffff_0000, 0x000a_0000);
        let mut enrolled: *mut SkEnrollResponse = std::ptr::null_mut();
        let app = c"ssh:";
        // SAFETY: arguments as OpenSSH passes them.
        let rc = unsafe {
            sk_enroll(
                1,
                std::ptr::null(),
                0,
                app.as_ptr(),
                0x01,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut enrolled,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: a response sk_enroll filled in.
        let (flags, public, handle) = unsafe {
            let r = &*enrolled;
            (
                r.flags,
                std::slice::from_raw_parts(r.public_key, r.public_key_len).to_vec(),
                std::slice::from_raw_parts(r.key_handle, r.key_handle_len).to_vec(),
            )
        };
        assert_eq!((flags, public.len()), (0x01, 32));
        let mut signed: *mut SkSignResponse = std::ptr::null_mut();
        let data = b"to be signed";
        // SAFETY: as above.
        let rc = unsafe {
            sk_sign(
                1,
                data.as_ptr(),
                data.len(),
                app.as_ptr(),
                handle.as_ptr(),
                handle.len(),
                0x01,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut signed,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: a response sk_sign filled in; freed as OpenSSH frees it.
        unsafe {
            let s = &*signed;
            assert_eq!(s.sig_r_len, 64);
            assert!(s.sig_s.is_null());
            libc::free(s.sig_r as *mut c_void);
            libc::free(signed as *mut c_void);
            free_enroll(enrolled);
        }
        // An unknown algorithm is unsupported.
        let mut none: *mut SkEnrollResponse = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe {
            sk_enroll(
                9,
                std::ptr::null(),
                0,
                app.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut none,
            )
        };
        assert_eq!((rc, none.is_null()), (-2, true));
    }
}
