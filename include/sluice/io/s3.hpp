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
/// - credentials: the AWS CLI's chain (io/detail/aws_credentials.hpp; README "Credentials"):
///   the environment's keys (not when a profile is named here, as `aws --profile`), web
///   identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN through STS), the profile (this,
///   else AWS_PROFILE, else `default`) in the shared files (an assumed role, static keys,
///   credential_process), container credentials (AWS_CONTAINER_CREDENTIALS_*_URI), then
///   instance metadata (IMDSv2, unless AWS_EC2_METADATA_DISABLED=true). A source that is
///   set up but fails is an error naming it and the status. Temporary credentials are
///   refreshed before they expire, and read again once after S3 refuses them
///   (ExpiredToken); the fetch stage's figures name the source (`credentials`).
/// - addressing: this, else the profile's `s3 =` / `addressing_style` (path, virtual);
/// - CA bundle for https: this, else `AWS_CA_BUNDLE`, the profile's `ca_bundle`, else the
///   system's (fetch_options::ca_file, when set, wins for objects).
/// Environment keys half set (an id without a secret) are an error, not skipped.
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

// The machinery lives in io/detail/: s3_config.hpp (URLs, the AWS settings, the credential
// provider), aws_credentials.hpp (the credential chain and resolve_s3), s3_sign.hpp (SigV4
// through curl), aws_http.hpp (small blocking requests, S3 and STS error replies),
// s3_list.hpp (ListObjectsV2). fetch() and list() include what they use.
