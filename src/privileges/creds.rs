//! A thread's credentials as `/proc/.../status` shows them.

use super::PrivilegeError;

/// The credentials of one thread that the drop changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadCreds {
    /// Real, effective, saved and file-system user IDs.
    pub uids: [u32; 4],
    /// Real, effective, saved and file-system group IDs.
    pub gids: [u32; 4],
    /// `CapInh`.
    pub inheritable: u64,
    /// `CapPrm`.
    pub permitted: u64,
    /// `CapEff`.
    pub effective: u64,
    /// `CapBnd`.
    pub bounding: u64,
    /// `CapAmb`.
    pub ambient: u64,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
}

impl ThreadCreds {
    /// The calling thread's credentials.
    pub fn of_self() -> Result<Self, PrivilegeError> {
        Self::read("/proc/thread-self/status")
    }

    /// The credentials in the status file at `path`.
    pub fn read(path: &str) -> Result<Self, PrivilegeError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PrivilegeError::Status(format!("{path}: {e}")))?;
        Self::parse(&text)
            .ok_or_else(|| PrivilegeError::Status(format!("{path}: unexpected format")))
    }

    /// Parses a `status` file; `None` when a field is missing or malformed.
    pub fn parse(status: &str) -> Option<Self> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let ids = |name: &str| -> Option<[u32; 4]> {
            let mut out = [0; 4];
            let mut parts = field(name)?.split_whitespace();
            for slot in &mut out {
                *slot = parts.next()?.parse().ok()?;
            }
            Some(out)
        };
        let mask = |name: &str| u64::from_str_radix(field(name)?, 16).ok();
        Some(Self {
            uids: ids("Uid")?,
            gids: ids("Gid")?,
            inheritable: mask("CapInh")?,
            permitted: mask("CapPrm")?,
            effective: mask("CapEff")?,
            bounding: mask("CapBnd")?,
            // Absent before Linux 4.3: nothing ambient then.
            ambient: mask("CapAmb").unwrap_or(0),
            no_new_privs: field("NoNewPrivs").is_some_and(|v| v == "1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_status_file() {
        let status = "Name:\ticecore\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                      CapInh:\t0000000000000000\nCapPrm:\t0000018400080004\nCapEff:\t0000018400080004\n\
                      CapBnd:\t0000018400080004\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
        let creds = ThreadCreds::parse(status).unwrap();
        assert_eq!(creds.uids, [65534; 4]);
        assert_eq!(creds.gids, [65534; 4]);
        assert_eq!(creds.permitted, super::super::kept_mask());
        assert_eq!(creds.effective, creds.bounding);
        assert_eq!((creds.inheritable, creds.ambient), (0, 0));
        assert!(creds.no_new_privs);
        assert!(ThreadCreds::parse("Uid:\t0\t0\t0\n").is_none());
        assert!(
            ThreadCreds::parse(&status.replace("CapEff:\t0000018400080004", "CapEff:\tzz"))
                .is_none()
        );
    }
}
