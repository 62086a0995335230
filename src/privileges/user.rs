//! `--user NAME|UID`: the account the agent runs as after start-up.

use std::ffi::{CStr, CString};

/// An account from the user database (`/etc/passwd`, or NSS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The name, or the number given when the account has no name.
    pub name: String,
    /// The user ID.
    pub uid: u32,
    /// The primary group ID.
    pub gid: u32,
    /// Every group the user is in, the primary one included.
    pub groups: Vec<u32>,
}

/// Why `--user` names no usable account.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// No account has this name (or number).
    #[error("--user {0}: no such user")]
    NotFound(String),
    /// The user database could not be read.
    #[error("--user {name}: cannot look the user up")]
    Lookup {
        /// What was looked up.
        name: String,
        /// The error of getpwnam_r/getpwuid_r.
        source: std::io::Error,
    },
    /// Root is what the agent runs as already; `--user` is for leaving it.
    #[error("--user {0}: that is root; leave --user out to stay root")]
    Root(String),
}

/// Most groups one user may be in (the kernel's `NGROUPS_MAX`).
const MAX_GROUPS: usize = 65536;

impl User {
    /// Looks up `spec`, a user name or a numeric user ID.
    pub fn lookup(spec: &str) -> Result<Self, UserError> {
        let spec = spec.trim();
        let found = match spec.parse::<u32>() {
            Ok(uid) => passwd_entry(spec, |pwd, buf, result| {
                // SAFETY: every pointer is valid for the sizes given.
                unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
            })?,
            Err(_) => {
                let name = CString::new(spec).map_err(|_| UserError::NotFound(spec.to_owned()))?;
                passwd_entry(spec, |pwd, buf, result| {
                    // SAFETY: every pointer is valid for the sizes given.
                    unsafe {
                        libc::getpwnam_r(name.as_ptr(), pwd, buf.as_mut_ptr(), buf.len(), result)
                    }
                })?
            }
        };
        let (name, uid, gid) = match (found, spec.parse::<u32>()) {
            (Some(entry), _) => entry,
            // A bare number need not be in the user database (a pod's
            // runAsUser rarely is): its group is the same number.
            (None, Ok(uid)) => (spec.to_owned(), uid, uid),
            (None, Err(_)) => return Err(UserError::NotFound(spec.to_owned())),
        };
        if uid == 0 {
            return Err(UserError::Root(spec.to_owned()));
        }
        let groups = group_list(&name, gid);
        Ok(Self {
            name,
            uid,
            gid,
            groups,
        })
    }

    /// Adds `gid` to the supplementary groups (the Docker socket's group).
    pub fn add_group(&mut self, gid: u32) {
        if !self.groups.contains(&gid) {
            self.groups.push(gid);
        }
    }
}

/// Runs a `getpw*_r` call with a growing buffer; the entry's name, UID and
/// GID, or `None` when there is no such user.
fn passwd_entry(
    spec: &str,
    call: impl Fn(*mut libc::passwd, &mut [libc::c_char], *mut *mut libc::passwd) -> libc::c_int,
) -> Result<Option<(String, u32, u32)>, UserError> {
    let mut size = 1024;
    loop {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: an all-zero passwd is a valid value (null pointers, zero IDs).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result = std::ptr::null_mut();
        let rc = call(&mut pwd, &mut buf, &mut result);
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if rc != 0 {
            // ENOENT and friends mean "not found" to some NSS modules.
            if matches!(rc, libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM) {
                return Ok(None);
            }
            return Err(UserError::Lookup {
                name: spec.to_owned(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        if result.is_null() {
            return Ok(None);
        }
        let name = if pwd.pw_name.is_null() {
            spec.to_owned()
        } else {
            // SAFETY: getpw*_r set pw_name to a NUL-terminated string in `buf`.
            unsafe { CStr::from_ptr(pwd.pw_name) }
                .to_string_lossy()
                .into_owned()
        };
        return Ok(Some((name, pwd.pw_uid, pwd.pw_gid)));
    }
}

/// The groups `name` is in (its primary group `gid` first); only `gid`
/// when the group database cannot say.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c_name) = CString::new(name) else {
        return vec![gid];
    };
    let mut count: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; usize::try_from(count).unwrap_or(32)];
        let mut n = count;
        // SAFETY: `groups` has room for `n` entries.
        let rc = unsafe { libc::getgrouplist(c_name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(usize::try_from(n).unwrap_or(0));
            if !groups.contains(&gid) {
                groups.insert(0, gid);
            }
            return groups;
        }
        // -1: `n` now holds the number needed.
        if n <= count || usize::try_from(n).unwrap_or(usize::MAX) > MAX_GROUPS {
            return vec![gid];
        }
        count = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_users_up_by_name_and_number() {
        // Every Debian and container image has nobody (65534).
        let nobody = User::lookup("nobody").unwrap();
        assert_eq!(nobody.uid, 65534);
        assert!(nobody.groups.contains(&nobody.gid));
        assert_eq!(User::lookup("65534").unwrap().name, "nobody");
        assert!(matches!(
            User::lookup("no-such-user-icecore"),
            Err(UserError::NotFound(_))
        ));
        let unnamed = User::lookup("4000123").unwrap();
        assert_eq!((unnamed.uid, unnamed.gid), (4000123, 4000123));
        assert!(matches!(User::lookup("root"), Err(UserError::Root(_))));
        assert!(matches!(User::lookup("0"), Err(UserError::Root(_))));
        let mut user = nobody.clone();
        user.add_group(999);
        user.add_group(999);
        assert_eq!(user.groups.iter().filter(|&&g| g == 999).count(), 1);
    }
}
