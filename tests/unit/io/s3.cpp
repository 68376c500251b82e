#include <sluice/io/s3.hpp>

#include "support/servers.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/io/detail/s3_config.hpp>
#include <sluice/io/detail/s3_list.hpp>
#include <sluice/io/detail/s3_sign.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/io/http.hpp>
#include <sluice/io/list.hpp>
#include <sluice/ops/plan.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <map>
#include <thread>

using sluice_test::counter;

namespace {

// AWS's published example credentials (S3 API reference, "Signature Calculations for the
// Authorization Header", and the SigV4 test suite).
constexpr const char* example_key = "AKIAIOSFODNN7EXAMPLE";
constexpr const char* example_secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr const char* empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Accepts one connection on 127.0.0.1, keeps the request's head, answers 200 empty.
class capture_server {
public:
    capture_server() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 1) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
            throw std::runtime_error("capture server: cannot listen");
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) return;
            char buf[4096];
            while (head_.find("\r\n\r\n") == std::string::npos) {
                const auto n = ::recv(c, buf, sizeof buf, 0);
                if (n <= 0) break;
                head_.append(buf, static_cast<std::size_t>(n));
            }
            const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            (void)::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
            ::close(c);
        });
    }
    ~capture_server() {
        ::shutdown(fd_, SHUT_RDWR);
        if (thread_.joinable()) thread_.join();
        ::close(fd_);
    }
    int port() const { return port_; }
    /// The request's head (after the request was made).
    std::string head() {
        if (thread_.joinable()) thread_.join();
        return head_;
    }

private:
    int fd_ = -1, port_ = 0;
    std::thread thread_;
    std::string head_;
};

/// Sends a GET of `url` signed per `auth` with extra headers to a capture server that
/// stands in for the URL's host (curl's CONNECT_TO: only loopback is reached), and
/// returns the request head it saw.
std::string signed_request(const std::string& url, const sluice::detail::s3_auth& auth,
                           const std::vector<std::string>& extra = {}) {
    capture_server cap;
    CURL* e = sluice::detail::curl_easy();
    curl_slist* headers = nullptr;
    for (auto& h : extra) headers = curl_slist_append(headers, h.c_str());
    std::string sigv4;
    sluice::detail::s3_sign(e, headers, auth, sigv4);
    const std::string host = url.substr(7, url.find('/', 7) - 7);
    const std::string connect_to = host + ":80:127.0.0.1:" + std::to_string(cap.port());
    curl_slist* connect = curl_slist_append(nullptr, connect_to.c_str());
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_CONNECT_TO, connect);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    const auto rc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    curl_slist_free_all(headers);
    curl_slist_free_all(connect);
    REQUIRE(rc == CURLE_OK);
    return cap.head();
}

std::string header_value(const std::string& head, const std::string& name) {
    const auto at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return {};
    const auto from = at + 4 + name.size();
    return head.substr(from, head.find("\r\n", from) - from);
}

sluice::detail::s3_auth example_auth() {
    return {.s3 = true,
            .sign = true,
            .region = "us-east-1",
            .access_key = example_key,
            .secret_key = example_secret,
            .payload_hash = empty_sha256,
            .amz_date = "20130524T000000Z"};
}

sluice::detail::s3_config example_config() {
    sluice::detail::s3_config c;
    c.scheme = "http";  // the scheme is not signed; the capture server speaks plain HTTP
    c.host = "s3.amazonaws.com";
    c.region = "us-east-1";
    return c;
}

}  // namespace

TEST_CASE("s3: the query is canonical as SigV4 wants it (AWS's test-suite cases)", "[s3][sigv4]") {
    using sluice::detail::s3_query;
    // get-vanilla-query-order-key-case: sorted by name, case-sensitively.
    REQUIRE(s3_query({{"Param2", "value2"}, {"Param1", "value1"}}) == "Param1=value1&Param2=value2");
    // get-vanilla-query-order-value: same name, sorted by value.
    REQUIRE(s3_query({{"Param1", "value2"}, {"Param1", "Value1"}}) == "Param1=Value1&Param1=value2");
    // get-vanilla-query-unreserved: unreserved characters stay as they are.
    const std::string unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    REQUIRE(s3_query({{unreserved, unreserved}}) == unreserved + "=" + unreserved);
    // get-vanilla-utf8-query: UTF-8 bytes, upper-case hex.
    REQUIRE(s3_query({{"\xe1\x88\xb4", "bar"}}) == "%E1%88%B4=bar");
    // What S3 listings send: '/', '+', '=' and spaces encoded; an empty value keeps its '='.
    REQUIRE(s3_query({{"prefix", "a b/c+d="}, {"list-type", "2"}, {"continuation-token", ""}}) ==
            "continuation-token=&list-type=2&prefix=a%20b%2Fc%2Bd%3D");
}

TEST_CASE("s3: GetObject is signed exactly as AWS's published example", "[s3][sigv4]") {
    // S3 API reference, "Example: GET Object": GET /test.txt with Range: bytes=0-9.
    const auto cfg = example_config();
    const auto url = sluice::detail::s3_http_url(cfg, {"examplebucket", "test.txt"});
    REQUIRE(url == "http://examplebucket.s3.amazonaws.com/test.txt");
    const auto head = signed_request(url, example_auth(), {"Range: bytes=0-9"});
    REQUIRE(header_value(head, "Authorization") ==
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
    REQUIRE(header_value(head, "x-amz-content-sha256") == empty_sha256);
}

TEST_CASE("s3: a listing's query is signed exactly as AWS's published example", "[s3][sigv4]") {
    // S3 API reference, "Example: GET Bucket (List Objects)": ?max-keys=2&prefix=J, given
    // here in the wrong order: s3_query must sort it for the signature to hold.
    const auto cfg = example_config();
    const auto url = sluice::detail::s3_http_url(cfg, {"examplebucket", ""}, sluice::detail::s3_query({{"prefix", "J"}, {"max-keys", "2"}}));
    REQUIRE(url == "http://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J");
    const auto head = signed_request(url, example_auth());
    REQUIRE(header_value(head, "Authorization") ==
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("s3: a session token is sent and signed, anonymous requests carry no signature", "[s3][sigv4]") {
    auto auth = example_auth();
    auth.session_token = "FQoGZXIvYXdzEXAMPLETOKEN/+=";
    const auto head = signed_request("http://examplebucket.s3.amazonaws.com/test.txt", auth);
    REQUIRE(header_value(head, "x-amz-security-token") == auth.session_token);
    REQUIRE(header_value(head, "Authorization").find("SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,") !=
            std::string::npos);
    const auto anon = signed_request("http://examplebucket.s3.amazonaws.com/test.txt", {});
    REQUIRE(header_value(anon, "Authorization").empty());
    REQUIRE(header_value(anon, "x-amz-content-sha256").empty());
}

TEST_CASE("s3: keys with /./ and /../ are sent as written, not collapsed into another key", "[s3]") {
    const auto cfg = example_config();
    const auto url = sluice::detail::s3_http_url(cfg, {"examplebucket", "a/../x/./y"});
    REQUIRE(url == "http://examplebucket.s3.amazonaws.com/a/../x/./y");
    for (const auto& auth : {example_auth(), sluice::detail::s3_auth{.s3 = true}}) {
        const auto head = signed_request(url, auth);
        REQUIRE(head.starts_with("GET /a/../x/./y HTTP/1.1\r\n"));
    }
}

TEST_CASE("s3: signatures with UNSIGNED-PAYLOAD, encoded queries and a session token match botocore's", "[s3][sigv4]") {
    if (sluice_test::run({"/usr/bin/env", "python3", "-c", "import botocore"}).status != 0) {
        WARN("[test skipped] python3 with botocore is missing");
        return;
    }
    const auto cfg = example_config();
    struct example {
        std::string key;
        std::vector<std::pair<std::string, std::string>> query;
        std::string token;
    };
    const std::vector<example> examples{
        {"train/shard 000+1=(2).tar", {}, ""},
        {"", {{"list-type", "2"}, {"prefix", "train/a b+c"}, {"continuation-token", "1/rQN5m50rp+subkeh1Emp=="}}, ""},
        {"\xc3\xa9t\xc3\xa9/x~y.bin", {}, "FQoGZXIvYXdzEXAMPLE/TOKEN+=="},
    };
    for (const auto& ex : examples) {
        auto auth = example_auth();
        auth.payload_hash = "UNSIGNED-PAYLOAD";
        auth.session_token = ex.token;
        const auto url = sluice::detail::s3_http_url(cfg, {"examplebucket", ex.key}, sluice::detail::s3_query(ex.query));
        INFO(url);
        std::vector<std::string> argv{"/usr/bin/env", "python3", SLUICE_SIGV4_BOTOCORE, url, auth.amz_date,
                                      example_key, example_secret, "us-east-1", "UNSIGNED-PAYLOAD"};
        if (!ex.token.empty()) argv.push_back(ex.token);
        const auto want = sluice_test::run(argv);
        INFO(want.err);
        REQUIRE(want.status == 0);
        const auto space = want.out.find(' ');
        const std::string signed_headers = want.out.substr(0, space);
        const std::string signature = want.out.substr(space + 1, 64);
        const auto got = header_value(signed_request(url, auth), "Authorization");
        REQUIRE(got == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=" +
                           signed_headers + ", Signature=" + signature);
    }
}

TEST_CASE("s3: URLs: virtual-hosted by default, path style for IPs, localhost, odd buckets or when asked", "[s3]") {
    using sluice::detail::s3_http_url;
    sluice::detail::s3_config c;
    c.host = "s3.eu-west-1.amazonaws.com";
    REQUIRE(s3_http_url(c, {"data", "train/shard-000.tar"}) == "https://data.s3.eu-west-1.amazonaws.com/train/shard-000.tar");
    // Keys are encoded once, '/' kept: spaces, '+', '=', '%', UTF-8.
    REQUIRE(s3_http_url(c, {"data", "a b/c+d=e%f/\xc3\xa9t\xc3\xa9.txt"}) ==
            "https://data.s3.eu-west-1.amazonaws.com/a%20b/c%2Bd%3De%25f/%C3%A9t%C3%A9.txt");
    REQUIRE(s3_http_url(c, {"my.dotted.bucket", "k"}) == "https://s3.eu-west-1.amazonaws.com/my.dotted.bucket/k");
    REQUIRE(s3_http_url(c, {"Upper_Case", "k"}) == "https://s3.eu-west-1.amazonaws.com/Upper_Case/k");
    c.addressing = sluice::s3_addressing::path;
    REQUIRE(s3_http_url(c, {"data", "k"}) == "https://s3.eu-west-1.amazonaws.com/data/k");
    c.addressing = sluice::s3_addressing::automatic;
    c.scheme = "http";
    for (std::string host : {"127.0.0.1:9000", "localhost:9000", "localhost", "[::1]:9000", "10.1.2.3"}) {
        c.host = host;
        REQUIRE(s3_http_url(c, {"data", "k"}) == "http://" + host + "/data/k");
    }
    c.host = "minio.internal:9000";
    c.base_path = "/s3";
    REQUIRE(s3_http_url(c, {"data", "k"}) == "http://data.minio.internal:9000/s3/k");
    c.addressing = sluice::s3_addressing::virtual_hosted;
    c.host = "localhost:9000";
    c.base_path.clear();
    REQUIRE(s3_http_url(c, {"data", "k"}) == "http://data.localhost:9000/k");
    REQUIRE(!sluice::detail::parse_s3_url("s3:///key"));
    REQUIRE(!sluice::detail::parse_s3_url("http://b/k"));
    REQUIRE(sluice::detail::parse_s3_url("s3://b")->key.empty());
    REQUIRE(sluice::detail::parse_s3_url("s3://b/p/q")->key == "p/q");
}

TEST_CASE("s3: endpoint, region and credentials are found in the AWS CLI's order", "[s3][config]") {
    using sluice_test::scoped_env;
    sluice_test::temp_dir d;
    const auto creds = d.write("credentials",
                               "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret\n"
                               "[other]\naws_access_key_id=AKIDOTHER\naws_secret_access_key=other-secret\n"
                               "aws_session_token=other-token\n");
    const auto config = d.write("config",
                                "[default]\nregion = eu-central-1\n# a comment\n"
                                "[profile cfg]\nregion=ap-south-1\nendpoint_url = http://127.0.0.1:9000\n"
                                "s3 =\n  addressing_style = path\n"
                                "aws_access_key_id = AKIDCFG\naws_secret_access_key = cfg-secret\n");
    const std::string url = "s3://b/k";
    auto clean = [&](std::vector<std::pair<std::string, std::optional<std::string>>> extra) {
        std::vector<std::pair<std::string, std::optional<std::string>>> v{
            {"AWS_ACCESS_KEY_ID", std::nullopt},      {"AWS_SECRET_ACCESS_KEY", std::nullopt},
            {"AWS_SESSION_TOKEN", std::nullopt},      {"AWS_PROFILE", std::nullopt},
            {"AWS_REGION", std::nullopt},             {"AWS_DEFAULT_REGION", std::nullopt},
            {"AWS_ENDPOINT_URL", std::nullopt},       {"AWS_ENDPOINT_URL_S3", std::nullopt},
            {"AWS_SHARED_CREDENTIALS_FILE", creds},   {"AWS_CONFIG_FILE", config},
            {"AWS_WEB_IDENTITY_TOKEN_FILE", std::nullopt},
            {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", std::nullopt},
            {"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::nullopt},
            {"AWS_EC2_METADATA_DISABLED", "true"}};
        for (auto& e : extra) v.push_back(e);
        return v;
    };
    SECTION("the environment's keys come first") {
        scoped_env env(clean({{"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "env-secret"}, {"AWS_SESSION_TOKEN", "env-token"}}));
        const auto c = sluice::detail::resolve_s3({}, url);
        REQUIRE(c.creds().access_key == "AKIDENV");
        REQUIRE(c.creds().secret_key == "env-secret");
        REQUIRE(c.creds().session_token == "env-token");
        REQUIRE(c.where() == "the environment");
        REQUIRE(c.region == "eu-central-1");  // the default profile's
        REQUIRE(c.host == "s3.eu-central-1.amazonaws.com");
        REQUIRE(c.scheme == "https");
    }
    SECTION("then the shared credentials file, for AWS_PROFILE") {
        scoped_env env(clean({{"AWS_PROFILE", "other"}, {"AWS_DEFAULT_REGION", "us-west-2"}}));
        const auto c = sluice::detail::resolve_s3({}, url);
        REQUIRE(c.creds().access_key == "AKIDOTHER");
        REQUIRE(c.creds().session_token == "other-token");
        REQUIRE(c.where() == creds + " [other]");
        REQUIRE(c.region == "us-west-2");
    }
    SECTION("then the config file; a profile named in the options wins over the environment") {
        scoped_env env(clean({{"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "env-secret"}}));
        const auto c = sluice::detail::resolve_s3({.profile = "cfg"}, url);
        REQUIRE(c.creds().access_key == "AKIDCFG");
        REQUIRE(c.where() == config + " [cfg]");
        REQUIRE(c.region == "ap-south-1");
        REQUIRE(c.host == "127.0.0.1:9000");  // the profile's endpoint_url
        REQUIRE(c.scheme == "http");
    }
    SECTION("options over AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL; AWS_REGION over AWS_DEFAULT_REGION") {
        scoped_env env(clean({{"AWS_ENDPOINT_URL", "http://general:1"}, {"AWS_ENDPOINT_URL_S3", "https://s3only:2/base/"},
                              {"AWS_REGION", "r1"}, {"AWS_DEFAULT_REGION", "r2"}}));
        auto c = sluice::detail::resolve_s3({}, url);
        REQUIRE(c.host == "s3only:2");
        REQUIRE(c.base_path == "/base");
        REQUIRE(c.region == "r1");
        c = sluice::detail::resolve_s3({.endpoint = "http://mine:3", .region = "r0"}, url);
        REQUIRE(c.host == "mine:3");
        REQUIRE(c.region == "r0");
        REQUIRE_THROWS_WITH(sluice::detail::resolve_s3({.endpoint = "ftp://x"}, url),
                            Catch::Contains("the S3 endpoint's scheme must be http or https, not 'ftp'"));
    }
    SECTION("the config file as botocore reads it: [profile default], comments after headers, spaces, case, nested s3 =") {
        const auto cfg2 = d.write("config2",
                                  "[profile default] ; the default profile, named the long way\n"
                                  "Region = eu-north-1\n"
                                  "[profile   spaced]\nregion = sa-east-1\ns3 =\n  addressing_style = virtual\n"
                                  "endpoint_url = http://localhost:9000\n");
        scoped_env env(clean({{"AWS_CONFIG_FILE", cfg2}, {"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "s"}}));
        auto c = sluice::detail::resolve_s3({}, url);
        REQUIRE(c.region == "eu-north-1");
        c = sluice::detail::resolve_s3({.profile = "spaced", .anonymous = true}, url);
        REQUIRE(c.region == "sa-east-1");
        REQUIRE(c.addressing == sluice::s3_addressing::virtual_hosted);  // over localhost's automatic path style
        REQUIRE(sluice::detail::s3_http_url(c, {"b", "k"}) == "http://b.localhost:9000/k");
    }
    SECTION("the profile's nested addressing_style; options win over it") {
        scoped_env env(clean({}));
        auto c = sluice::detail::resolve_s3({.profile = "cfg"}, url);
        REQUIRE(c.addressing == sluice::s3_addressing::path);
        c = sluice::detail::resolve_s3({.profile = "cfg", .addressing = sluice::s3_addressing::virtual_hosted}, url);
        REQUIRE(c.addressing == sluice::s3_addressing::virtual_hosted);
    }
    SECTION("half-set environment keys and malformed endpoints are errors") {
        {
            scoped_env env(clean({{"AWS_ACCESS_KEY_ID", "AKIDENV"}}));
            REQUIRE_THROWS_WITH(sluice::detail::resolve_s3({}, url),
                                Catch::StartsWith("sluice: partial AWS credentials in the environment: AWS_ACCESS_KEY_ID is "
                                                  "set, AWS_SECRET_ACCESS_KEY is not, for 's3://b/k'"));
        }
        scoped_env env(clean({}));
        REQUIRE_THROWS_WITH(sluice::detail::resolve_s3({.endpoint = "localhost:9000"}, url),
                            Catch::Contains("the S3 endpoint 'localhost:9000' needs a scheme (http:// or https://)"));
        const auto msg = [&](const std::string& e) {
            try {
                sluice::detail::resolve_s3({.endpoint = e}, url);
            } catch (const std::exception& x) {
                return std::string(x.what());
            }
            return std::string();
        };
        const auto m = msg("http://user:hunter2@minio:9000");
        REQUIRE(m.find("without user, query or fragment") != std::string::npos);
        REQUIRE(m.find("hunter2") == std::string::npos);
        REQUIRE(sluice::detail::resolve_s3({.endpoint = "HTTP://Minio:9000"}, url).scheme == "http");
    }
    SECTION("no credentials: an error that says where it looked and what to do") {
        scoped_env env(clean({{"AWS_PROFILE", "nobody"}, {"AWS_CONFIG_FILE", d / "no-such-config"}}));
        REQUIRE_THROWS_WITH(sluice::detail::resolve_s3({}, url),
                            "sluice: no AWS credentials (looked in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, "
                                "AWS_WEB_IDENTITY_TOKEN_FILE (not set), " + creds + " [nobody] (no such section), " +
                                d / "no-such-config" +
                                " [profile nobody] (no such file), container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/"
                                "_FULL_URI not set), instance metadata (AWS_EC2_METADATA_DISABLED); for a public bucket use "
                                "anonymous access) for 's3://b/k': " +
                                std::make_error_code(std::errc::permission_denied).message());
        const auto anon = sluice::detail::resolve_s3({.anonymous = true}, url);
        REQUIRE(anon.where() == "anonymous");
        REQUIRE(!sluice::detail::auth_of(anon).sign);
    }
}

TEST_CASE("s3: XML replies are read whatever their namespace", "[s3][xml]") {
    using sluice::detail::parse_list_v2;
    using sluice::detail::s3_error_text;
    REQUIRE(s3_error_text("<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>The request signature "
                          "we calculated does not match</Message><StringToSign>AWS4-HMAC-SHA256...</StringToSign>"
                          "<AWSAccessKeyId>AKIDX</AWSAccessKeyId><RequestId>R1</RequestId></Error>") ==
            "SignatureDoesNotMatch: The request signature we calculated does not match (RequestId R1)");
    REQUIRE(s3_error_text("<s3:Error xmlns:s3=\"urn:x\"><s3:Code>SlowDown</s3:Code></s3:Error>") == "SlowDown");
    // A long reply (AWS echoes the canonical request, token included) is kept only in
    // part: what came before the cut still gives the message, and nothing else.
    const std::string token = "IQoJb3JpZ2luX2VjEXAMPLETOKEN";
    std::string longer = "<Error><Code>SignatureDoesNotMatch</Code><Message>Check your key</Message><RequestId>R2</RequestId>"
                         "<CanonicalRequest>GET\n/k\n\nx-amz-security-token:" + token + std::string(20000, 'x') +
                         "</CanonicalRequest></Error>";
    longer.resize(16384);
    REQUIRE(s3_error_text(longer) == "SignatureDoesNotMatch: Check your key (RequestId R2)");
    REQUIRE(s3_error_text("<html><body>Bad gateway</body></html>").empty());
    REQUIRE(s3_error_text("not xml <Code>").empty());

    // AWS's namespace, s3rver's, and a prefixed one.
    for (std::string ns : {"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"", "xmlns=\"http://doc.s3.amazonaws.com/2006-03-01/\""}) {
        auto p = parse_list_v2("<ListBucketResult " + ns + "><Name>b</Name><IsTruncated>true</IsTruncated>"
                               "<NextContinuationToken>1/a+b==</NextContinuationToken><Contents><Key>x/1</Key></Contents>"
                               "<Contents><Key>x/&amp;2</Key><Size>3</Size></Contents></ListBucketResult>");
        REQUIRE(p);
        REQUIRE(p->keys == std::vector<std::string>{"x/1", "x/&2"});
        REQUIRE(p->truncated);
        REQUIRE(p->next_token == "1/a+b==");
    }
    auto p = parse_list_v2("<a:ListBucketResult xmlns:a=\"u\"><a:IsTruncated>false</a:IsTruncated><a:Contents><a:Key>k</a:Key>"
                           "</a:Contents></a:ListBucketResult>");
    REQUIRE(p);
    REQUIRE(p->keys == std::vector<std::string>{"k"});
    REQUIRE(!p->truncated);
    REQUIRE(!parse_list_v2("<Error><Code>AccessDenied</Code></Error>"));
    REQUIRE(!parse_list_v2("<ListBucketResult><Contents>"));
}

// ---- against real servers ---------------------------------------------------------------

namespace {
std::map<std::string, std::string> read_all(sluice::pipeline<sluice::record>& p) {
    std::map<std::string, std::string> got;
    for (auto& rec : p) got[rec.source->url] = std::string(rec.data.view());
    return got;
}
}  // namespace

TEST_CASE("s3: moto with signature checking: the right key reads every object, a wrong secret is a clear 403",
          "[s3][moto]") {
    SLUICE_SKIP_WITHOUT("moto");
    sluice_test::temp_dir root;
    sluice::detail::rng r(sluice_test::test_seed());
    std::map<std::string, std::string> want;
    for (int i = 0; i < 40; ++i) {
        // A space needs encoding in the path. Not '(' or '+': moto's checker signs those
        // unencoded and rejects boto3's requests for them as it does ours (AWS encodes
        // them, as the published examples above show); s3rver's test fetches such keys.
        const std::string key = "train/shard-" + std::to_string(i) + (i % 7 == 0 ? " copy.bin" : ".bin");
        const std::string body = sluice_test::random_bytes(r, i == 3 ? (3u << 20) + 17 : 1000 + 97 * i);
        root.write("data/" + key, body);
        want["s3://data/" + key] = body;
    }
    sluice_test::s3_server moto("moto", root.path().string());
    using sluice_test::scoped_env;
    scoped_env env({{"AWS_ACCESS_KEY_ID", moto.key()},
                    {"AWS_SECRET_ACCESS_KEY", moto.secret()},
                    {"AWS_SESSION_TOKEN", std::nullopt},
                    {"AWS_PROFILE", std::nullopt},
                    {"AWS_ENDPOINT_URL", moto.endpoint()},
                    {"AWS_ENDPOINT_URL_S3", std::nullopt},
                    {"AWS_REGION", "us-east-1"}});
    {
        // Listed (the whole bucket: moto rejects encoded query values under checking),
        // then fetched with ranged parts (1 MiB) and many in flight.
        sluice::pipeline p(sluice::list("s3://data") | sluice::plan() |
                           sluice::fetch({.concurrency = 8, .part_size = 1u << 20, .max_part_size = 1u << 20}) | sluice::raw());
        REQUIRE(read_all(p) == want);
        REQUIRE(counter(p.figures(), "fetch", "parts") >= 3);
        REQUIRE(counter(p.figures(), "fetch", "retries") == 0);
    }
    {
        scoped_env wrong({{"AWS_SECRET_ACCESS_KEY", "wrong" + moto.secret()}});
        sluice::pipeline p(sluice::list("s3://data/train/shard-1.bin") | sluice::plan() | sluice::fetch() | sluice::raw());
        std::string msg;
        try {
            p.next_blocking();
        } catch (const sluice::source_error& e) {
            msg = e.what();
            REQUIRE(e.url() == "s3://data/train/shard-1.bin");
        }
        REQUIRE(msg.starts_with("sluice: cannot fetch (HTTP 403 SignatureDoesNotMatch: The request signature we calculated "
                                "does not match the signature you provided."));
        REQUIRE(msg.find("(RequestId ") != std::string::npos);
        REQUIRE(msg.ends_with("'s3://data/train/shard-1.bin'"));
        REQUIRE(msg.find(moto.secret()) == std::string::npos);
        REQUIRE(counter(p.figures(), "fetch", "retries") == 0);  // 403 is not transient

        sluice::pipeline l(sluice::list("s3://data/") | sluice::plan() | sluice::fetch() | sluice::raw());
        REQUIRE_THROWS_WITH(l.next_blocking(), Catch::StartsWith("sluice: cannot list (HTTP 403 SignatureDoesNotMatch: ") &&
                                                   Catch::EndsWith("'s3://data/'"));
    }
    {
        sluice::pipeline p(sluice::list("s3://data/train/no-such-key") | sluice::plan() | sluice::fetch() | sluice::raw());
        REQUIRE_THROWS_WITH(p.next_blocking(), Catch::StartsWith("sluice: cannot fetch (HTTP 404 NoSuchKey: ") &&
                                                   Catch::EndsWith("'s3://data/train/no-such-key'"));
        sluice::pipeline b(sluice::list("s3://no-such-bucket/") | sluice::plan() | sluice::fetch() | sluice::raw());
        REQUIRE_THROWS_WITH(b.next_blocking(), Catch::StartsWith("sluice: cannot list (HTTP 404 NoSuchBucket: "));
    }
}

TEST_CASE("s3: s3rver: more than 1,000 keys page through continuation tokens with '/', '+' and '='", "[s3][s3rver]") {
    SLUICE_SKIP_WITHOUT("s3rver");
    sluice_test::temp_dir root;
    std::vector<std::string> want;
    for (int i = 0; i < 2100; ++i) {
        char name[64];
        std::snprintf(name, sizeof name, "many/part %04d+x=y.txt", i);
        root.write(std::string("data/") + name, std::to_string(i) + "\n");
        want.push_back(std::string("s3://data/") + name);
    }
    root.write("data/other/x.txt", "x\n");
    // (s3rver lists "many/..." before "many-not/..." and then pages by byte order, losing
    // the latter: a key that sorts the same both ways.)
    root.write("data/manyz/x.txt", "x\n");
    root.write("data/\xc3\xa9t\xc3\xa9/a b.txt", "utf8\n");
    sluice_test::s3_server s3rver("s3rver", root.path().string());
    const sluice::s3_options o{.endpoint = s3rver.endpoint(), .region = "us-east-1", .profile = {}};
    sluice_test::scoped_env env({{"AWS_ACCESS_KEY_ID", "S3RVER"}, {"AWS_SECRET_ACCESS_KEY", "S3RVER"}, {"AWS_PROFILE", std::nullopt}});

    // The server's tokens do carry the characters that must be encoded (else this test
    // would prove nothing about encoding them): its tokens are random base64, so walk
    // 100-key pages and look at all 21 of them.
    const auto cfg = sluice::detail::resolve_s3(o, "s3://data/");
    std::string token, with_specials;
    for (int page = 0; page < 40; ++page) {
        std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"}, {"max-keys", "100"}};
        if (!token.empty()) q.emplace_back("continuation-token", token);
        sluice::detail::s3_reply reply;
        sluice::detail::s3_get(sluice::detail::s3_http_url(cfg, {"data", ""}, sluice::detail::s3_query(q)),
                               sluice::detail::auth_of(cfg), reply);
        REQUIRE(reply.status == 200);
        token = sluice::detail::parse_list_v2(reply.body)->next_token;
        if (token.find_first_of("/+=") != std::string::npos) with_specials = token;
        if (token.empty()) break;
    }
    REQUIRE(!with_specials.empty());
    // The same 100-key pages through s3_list: every token goes back encoded.
    REQUIRE(sluice::detail::s3_list(o, "s3://data/many/", {}, 100) == want);

    // A prefix with '/' (encoded in the query), three pages.
    auto listed = sluice::expand({"s3://data/many/"}, o);
    REQUIRE(listed == want);
    // A wildcard lists the prefix before it and keeps what matches.
    REQUIRE(sluice::expand({"s3://data/many/part 00[0-1]?+x=y.txt"}, o).size() == 20);
    REQUIRE(sluice::expand({"s3://data/many*/x.txt"}, o) == std::vector<std::string>{"s3://data/manyz/x.txt"});
    REQUIRE_THROWS_WITH(sluice::expand({"s3://data/many/*.tar"}, o), Catch::StartsWith("sluice: no object matches 's3://data/many/*.tar'"));
    REQUIRE_THROWS_WITH(sluice::expand({"s3://data/nothing-here/"}, o), Catch::StartsWith("sluice: no object under 's3://data/nothing-here/'"));

    // Keys that need encoding in the path are fetched: spaces, '+', '=', UTF-8.
    sluice::pipeline p(sluice::list(std::vector<std::string>{"s3://data/many/part 0007+x=y.txt", "s3://data/\xc3\xa9t\xc3\xa9/"}, o) | sluice::plan() |
                       sluice::fetch({.s3 = o}) | sluice::raw());
    const auto got = read_all(p);
    REQUIRE(got == std::map<std::string, std::string>{{"s3://data/many/part 0007+x=y.txt", "7\n"},
                                                      {"s3://data/\xc3\xa9t\xc3\xa9/a b.txt", "utf8\n"}});
}

TEST_CASE("s3: throttling (503 SlowDown) backs off and retries, parts and resumes work over S3 URLs", "[s3][retry]") {
    // The project's fault server as a path-style S3 endpoint (it does not check signatures).
    sluice_test::temp_dir www;
    sluice::detail::rng r(sluice_test::test_seed());
    std::map<std::string, std::string> want;
    std::vector<std::string> urls;
    for (int i = 0; i < 12; ++i) {
        const std::string body = sluice_test::random_bytes(r, i == 0 ? (4u << 20) + 5 : 20000 + i);
        www.write("bkt/obj-" + std::to_string(i), body);
        urls.push_back("s3://bkt/obj-" + std::to_string(i));
        want[urls.back()] = body;
    }
    sluice_test::fault_server fs(www.path().string(), {"--p503", "0.3", "--ptrunc", "0.1", "--seed", std::to_string(sluice_test::test_seed())});
    const std::string endpoint = fs.url("").substr(0, fs.url("").size() - 1);
    sluice_test::scoped_env env({{"AWS_ACCESS_KEY_ID", "AKIDTEST"}, {"AWS_SECRET_ACCESS_KEY", "test-secret-value"}, {"AWS_PROFILE", std::nullopt}});
    sluice::pipeline p(sluice::list(urls) | sluice::plan() |
                       sluice::fetch({.concurrency = 8,
                                      .part_size = 1u << 20,
                                      .max_part_size = 1u << 20,  // every part 1 MiB: more of them to retry
                                      .parallel_parts_below_bytes_per_s = 0,  // side by side, however fast
                                      .retries = 30,
                                      .backoff_base = std::chrono::milliseconds(1),
                                      .backoff_cap = std::chrono::milliseconds(20),
                                      .s3 = {.endpoint = endpoint, .region = "us-east-1"}}) |
                       sluice::raw());
    REQUIRE(read_all(p) == want);
    const auto f = p.figures();
    REQUIRE(counter(f, "fetch", "throttled") > 0);
    REQUIRE(counter(f, "fetch", "parts") >= 4);
    REQUIRE(counter(f, "fetch", "retries") >= counter(f, "fetch", "throttled"));
}

TEST_CASE("s3: missing credentials stop the fetch with an error that says where it looked", "[s3][errors]") {
    sluice_test::temp_dir home;
    // Instance metadata is asked last: here at a loopback port nothing listens on (the
    // tests never reach 169.254.169.254).
    const std::string imds = "http://127.0.0.1:" + std::to_string(sluice_test::free_port());
    sluice_test::scoped_env env({{"AWS_ACCESS_KEY_ID", std::nullopt},
                                 {"AWS_SECRET_ACCESS_KEY", std::nullopt},
                                 {"AWS_PROFILE", std::nullopt},
                                 {"AWS_SHARED_CREDENTIALS_FILE", std::nullopt},
                                 {"AWS_CONFIG_FILE", std::nullopt},
                                 {"AWS_WEB_IDENTITY_TOKEN_FILE", std::nullopt},
                                 {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", std::nullopt},
                                 {"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::nullopt},
                                 {"AWS_EC2_METADATA_DISABLED", std::nullopt},
                                 {"AWS_EC2_METADATA_SERVICE_ENDPOINT", imds},
                                 {"HOME", home.path().string()}});
    sluice::pipeline p(sluice::list("s3://bucket/key.tar") | sluice::plan() |
                       sluice::fetch({.s3 = {.endpoint = "http://127.0.0.1:9"}}) | sluice::raw());
    REQUIRE_THROWS_WITH(p.next_blocking(),
                        Catch::StartsWith("sluice: no AWS credentials (looked in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment, "
                                          "AWS_WEB_IDENTITY_TOKEN_FILE (not set), " +
                                          home / ".aws/credentials [default] (no such file), ") &&
                            Catch::Contains("container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/_FULL_URI not set), "
                                            "instance metadata (" + imds + ": Couldn't connect to server") &&
                            Catch::Contains("for 's3://bucket/key.tar'"));
}

TEST_CASE("s3: virtual-hosted requests reach bucket.host, path-style ones host/bucket", "[s3][addressing]") {
    // nginx answers only requests for the host bkt.localhost (curl resolves *.localhost
    // to loopback by itself); anonymous, as for a public bucket.
    sluice_test::temp_dir www;
    www.write("train/a.bin", "virtual");
    www.write("bkt/train/a.bin", "path");
    sluice_test::nginx_server nginx(www.path().string(), false,
                                    "    if ($host != \"bkt.localhost\") { return 421; }\n"
                                    "    location /moved { return 307 http://127.0.0.1:1/elsewhere; }\n");
    const std::string endpoint = "http://localhost:" + std::to_string(nginx.port());
    auto fetch_one = [&](sluice::s3_addressing a, std::string url = "s3://bkt/train/a.bin") {
        sluice::pipeline p(sluice::list(url) | sluice::plan() |
                           sluice::fetch({.s3 = {.endpoint = endpoint, .addressing = a, .anonymous = true}}) | sluice::raw());
        return std::string(p.next_blocking()->data.view());
    };
    REQUIRE(fetch_one(sluice::s3_addressing::virtual_hosted) == "virtual");
    // The same server refuses other hosts: path style (automatic for localhost) gets 421.
    REQUIRE_THROWS_WITH(fetch_one(sluice::s3_addressing::automatic), "sluice: cannot fetch (HTTP 421) 's3://bkt/train/a.bin'");
    // S3 requests do not follow redirects (a signature and a session token must not go
    // to another host): the reply is the error.
    REQUIRE_THROWS_WITH(fetch_one(sluice::s3_addressing::virtual_hosted, "s3://bkt/moved"),
                        "sluice: cannot fetch (HTTP 307) 's3://bkt/moved'");
}
