#pragma once
// S3 and S3-compatible stores (MinIO, Ceph RGW, GCS's XML API...): where `s3://bucket/key`
// lives (endpoint, region, addressing), who asks (credentials, found as the AWS CLI finds
// them), how requests are signed (SigV4 by libcurl, plus what curl 7.88 leaves out), and
// ListObjectsV2 for prefixes.
//
// Signing is libcurl's CURLOPT_AWS_SIGV4. What curl 7.88 lacks is the project's own and is
// tested against AWS's published examples (tests/unit/io/s3.cpp):
// - the `x-amz-content-sha256` header S3 requires (UNSIGNED-PAYLOAD: our requests are GETs
//   without a body, and curl takes the payload hash from this header);
// - a canonical query string: curl signs the query exactly as written, so it is written
//   sorted by name with every byte but the unreserved ones percent-encoded (s3_query);
// - the session token header (`x-amz-security-token`), which curl signs like any header.
//
// Credentials live in the request only: never in a URL, a message, a log or a counter.

#include <optional>
#include <string>

namespace sluice {

/// How a bucket appears in request URLs: `https://bucket.host/key` (virtual-hosted, AWS's
/// default) or `https://host/bucket/key` (path style). `automatic` is virtual-hosted
/// except for IP-address and localhost endpoints and bucket names that are not valid host
/// names (dots, capitals, underscores), which get path style, as the AWS CLI does.
enum class s3_addressing { automatic, virtual_hosted, path };

/// Where S3 objects are and who reads them. Every field left empty is found the way the
/// AWS CLI finds it:
/// - endpoint: this, else `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
///   `endpoint_url`, else `https://s3.<region>.amazonaws.com`;
/// - region: this, else `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else
///   us-east-1;
/// - credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`),
///   else the profile in the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
///   default ~/.aws/credentials), else in the config file (`AWS_CONFIG_FILE`, default
///   ~/.aws/config). The profile is this, else `AWS_PROFILE`, else `default`; a profile
///   named here wins over the environment's keys (as `aws --profile` does).
/// - addressing: this, else the profile's `s3 =` / `addressing_style` (path, virtual);
/// - CA bundle for https: this, else `AWS_CA_BUNDLE`, the profile's `ca_bundle`, else the
///   system's (fetch_options::ca_file, when set, wins for objects).
/// Environment keys half set (an id without a secret) are an error, not skipped.
/// Credentials are read once per stage, when its first s3:// URL comes. Not read:
/// instance metadata (IMDS), container credentials, SSO, assume-role and
/// credential_process profiles; export their keys to the environment instead (and
/// restart before temporary ones expire: an ExpiredToken reply is not retried).
struct s3_options {
    std::string endpoint = {};
    std::string region = {};
    std::string profile = {};
    s3_addressing addressing = s3_addressing::automatic;
    /// No signature: for public buckets.
    bool anonymous = false;
    std::string ca_bundle = {};
};

}  // namespace sluice

// The machinery lives in io/detail/: s3_config.hpp (URLs, the AWS settings, credentials),
// s3_sign.hpp (SigV4 through curl), s3_list.hpp (ListObjectsV2). fetch() and list()
// include what they use.
