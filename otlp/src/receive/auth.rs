//! Who may send: a bearer token checked in constant time, from the headers
//! before a byte of the body is read. The receiver (`--otlp-listen`) and the
//! agent's HTTP endpoints (`--http-address`) share it, so there is one
//! comparison to get right.

use std::sync::Arc;

/// When a token is set, requests must carry `authorization: Bearer <token>`
/// (the scheme in any case, as RFC 9110 makes it case-insensitive).
#[derive(Clone, Default)]
pub struct BearerAuth {
    bearer_token: Option<Arc<str>>,
}

impl std::fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerAuth")
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The receiver's name for [`BearerAuth`].
pub type ReceiverAuth = BearerAuth;

impl BearerAuth {
    /// Requires `authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Self {
        Self {
            bearer_token: Some(Arc::from(token)),
        }
    }

    /// Whether a token is required.
    pub fn is_required(&self) -> bool {
        self.bearer_token.is_some()
    }

    /// Whether the `authorization` header value lets the request in.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        let Some(token) = &self.bearer_token else {
            return true;
        };
        let Some((scheme, given)) = authorization.and_then(|a| a.trim().split_once(' ')) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        let given = given.trim_start();
        // Compare every byte, so the time taken does not reveal the prefix matched.
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_exact() {
        let auth = BearerAuth::bearer("s3cret");
        for good in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "Bearer  s3cret",
        ] {
            assert!(auth.allows(Some(good)), "{good}");
        }
        for bad in [
            "Bearer nope",
            "s3cret",
            "Bearer s3cre",
            "Bearer s3crets",
            "Basic s3cret",
            "Bearers3cret",
            "",
        ] {
            assert!(!auth.allows(Some(bad)), "{bad}");
        }
        assert!(!auth.allows(None));
        assert!(BearerAuth::default().allows(None));
        assert!(!format!("{auth:?}").contains("s3cret"));
    }
}
