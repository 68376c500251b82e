// AWS credentials as cloud nodes have them (io/detail/aws_credentials.hpp): the chain's
// order, each source against a real server on loopback (the project's own IMDSv2,
// container and STS server, tests/support/aws_creds_server.py, and moto's STS), refresh
// before expiry and the re-read after ExpiredToken, with no secret in any message.

#include "support/servers.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/io/detail/aws_credentials.hpp>
#include <sluice/io/detail/s3_list.hpp>
#include <sluice/io/http.hpp>
#include <sluice/io/list.hpp>
#include <sluice/ops/plan.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <thread>

using sluice_test::counter;
using sluice_test::scoped_env;
using namespace std::chrono_literals;
namespace d = sluice::detail;

namespace {

/// Every AWS variable the chain reads, cleared, and the shared files pointed at nothing:
/// each test then sets what its case needs.
std::vector<std::pair<std::string, std::optional<std::string>>> bare_env(
    const sluice_test::temp_dir& dir, std::vector<std::pair<std::string, std::optional<std::string>>> extra = {}) {
    std::vector<std::pair<std::string, std::optional<std::string>>> v{
        {"AWS_ACCESS_KEY_ID", std::nullopt},
        {"AWS_SECRET_ACCESS_KEY", std::nullopt},
        {"AWS_SESSION_TOKEN", std::nullopt},
        {"AWS_PROFILE", std::nullopt},
        {"AWS_REGION", "us-east-1"},
        {"AWS_DEFAULT_REGION", std::nullopt},
        {"AWS_ENDPOINT_URL", std::nullopt},
        {"AWS_ENDPOINT_URL_S3", std::nullopt},
        {"AWS_ENDPOINT_URL_STS", std::nullopt},
        {"AWS_SHARED_CREDENTIALS_FILE", dir / "no-credentials"},
        {"AWS_CONFIG_FILE", dir / "no-config"},
        {"AWS_WEB_IDENTITY_TOKEN_FILE", std::nullopt},
        {"AWS_ROLE_ARN", std::nullopt},
        {"AWS_ROLE_SESSION_NAME", std::nullopt},
        {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", std::nullopt},
        {"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::nullopt},
        {"AWS_CONTAINER_AUTHORIZATION_TOKEN", std::nullopt},
        {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", std::nullopt},
        {"AWS_EC2_METADATA_DISABLED", "true"},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT", std::nullopt},
        {"AWS_METADATA_SERVICE_TIMEOUT", "5"},  // a Python server on a busy VM, not the hypervisor
        {"AWS_METADATA_SERVICE_NUM_ATTEMPTS", std::nullopt}};
    for (auto& e : extra) v.push_back(e);
    return v;
}

std::string resolve_error(const sluice::s3_options& o = {}) {
    try {
        (void)d::resolve_s3(o, "s3://b/k");
    } catch (const sluice::source_error& e) {
        return e.what();
    }
    return "(no error)";
}

/// `n` small objects under root/bkt/, each naming itself.
std::map<std::string, std::string> make_objects(sluice_test::temp_dir& root, int n) {
    std::map<std::string, std::string> want;
    for (int i = 0; i < n; ++i) {
        char key[32];
        std::snprintf(key, sizeof key, "obj-%03d.bin", i);
        std::string body = "object " + std::to_string(i) + " ";
        body.resize(2000 + 37 * i, static_cast<char>('a' + i % 26));
        root.write(std::string("bkt/") + key, body);
        want[std::string("s3://bkt/") + key] = body;
    }
    return want;
}

/// Reads every object through list → plan → fetch → raw; each URL must come exactly once.
std::map<std::string, std::string> read_objects(const std::map<std::string, std::string>& want, const std::string& endpoint,
                                                sluice::pipeline_figures* figures = nullptr) {
    std::vector<std::string> urls;
    for (auto& [u, _] : want) urls.push_back(u);
    sluice::pipeline p(sluice::list(urls) | sluice::plan() |
                       sluice::fetch({.concurrency = 4, .min_concurrency = 1,
                                      .s3 = {.endpoint = endpoint, .region = "us-east-1"}}) |
                       sluice::raw());
    std::map<std::string, std::string> got;
    for (auto& rec : p) {
        const bool fresh = got.emplace(rec.source->url, std::string(rec.data.view())).second;
        REQUIRE(fresh);  // exactly once
    }
    if (figures) *figures = p.figures();
    return got;
}

std::string server_stats(const sluice_test::aws_creds_server& s) {
    d::s3_reply r;
    d::blocking_call({.url = s.url("__stats")}, r);
    REQUIRE(r.result == CURLE_OK);
    REQUIRE(r.status == 200);
    return r.body;
}

using sluice_test::no_secret_in;

std::string everything_shown(const sluice::pipeline_figures& f) { return f.json() + "\n" + f.table(); }


}  // namespace

TEST_CASE("credentials: ISO 8601 times as STS, instance metadata and credential_process write them", "[credentials]") {
    const auto t = d::parse_iso8601("2026-11-24T20:50:04Z");
    REQUIRE(t);
    REQUIRE(std::chrono::system_clock::to_time_t(*t) == 1795553404);
    REQUIRE(*d::parse_iso8601("2026-11-24T20:50:04.250000Z") - *t == 250ms);
    REQUIRE(*d::parse_iso8601("2026-11-24T21:50:04+01:00") == *t);
    REQUIRE(*d::parse_iso8601("2026-11-24 20:50:04") == *t);
    REQUIRE(*d::parse_iso8601("2026-11-24T20:50:04.891945Z") - *t == 891945us);
    REQUIRE(!d::parse_iso8601("2026-11-24"));
    REQUIRE(!d::parse_iso8601("2026-13-24T20:50:04Z"));
    REQUIRE(!d::parse_iso8601("2026-11-24T20:50:04 GMT"));
    REQUIRE(!d::parse_iso8601("tomorrow"));
}

TEST_CASE("credentials: a provider refreshes before expiry, keeps valid ones while its source fails, and fails once they expired",
          "[credentials]") {
    // The test's own clock: t(ms) is T0 + ms. Credentials live 2 s of it.
    const auto T0 = std::chrono::system_clock::now();
    auto t = [&](int ms) { return T0 + std::chrono::milliseconds(ms); };
    std::atomic<int> clock_ms{0}, life_ms{2000}, calls{0};
    std::atomic<bool> failing{false};
    auto source = [&](std::stop_token) {
        if (failing) throw d::credentials_unavailable("test source: HTTP 503");
        const int n = ++calls;
        return d::s3_credentials{"AKID" + std::to_string(n), "secret", "token" + std::to_string(n), t(clock_ms + life_ms)};
    };
    d::credential_provider p("test source", source({}), source);
    REQUIRE(calls == 1);
    REQUIRE(p.refreshable());
    REQUIRE(!p.due(t(1499)));  // due in the last quarter of their life (from when made: t(0) and a bit)
    REQUIRE(p.due(t(1501)));
    p.refresh_if_due({}, t(1000));
    REQUIRE(calls == 1);
    clock_ms = 1600;
    p.refresh_if_due({}, t(1600));
    REQUIRE(calls == 2);
    REQUIRE(p.current().access_key == "AKID2");  // now valid until t(3600), due at t(3100)
    REQUIRE(p.refreshes() == 1);
    REQUIRE(!p.due(t(3000)));

    // The source fails while the held ones are still valid: they stay, and it is asked
    // again a little later (a quarter of what is left, at least 0.2 s).
    failing = true;
    REQUIRE_NOTHROW(p.refresh_if_due({}, t(3200)));
    REQUIRE(p.current().access_key == "AKID2");
    REQUIRE(p.refresh_failures() == 1);
    REQUIRE(!p.due(t(3399)));
    REQUIRE(p.due(t(3400)));
    // Once they expired, a failing source is an error; the next ask waits a second.
    REQUIRE_THROWS_WITH(p.refresh_if_due({}, t(3700)), "test source: HTTP 503");
    REQUIRE(p.refresh_failures() == 2);
    REQUIRE(!p.due(t(4600)));
    failing = false;
    clock_ms = 4700;
    life_ms = 3600 * 1000;
    p.refresh_if_due({}, t(4700));
    REQUIRE(p.current().access_key == "AKID3");
    REQUIRE(!p.due(t(4700 + 3300 * 1000 - 1)));  // an hour: due 5 minutes before its end
    REQUIRE(p.due(t(4700 + 3300 * 1000)));

    // A refusal reads the source again, once, unless they were already replaced.
    const auto refused = p.current();
    REQUIRE(p.reread_after_refusal(refused));
    REQUIRE(calls == 4);
    REQUIRE(p.reread_after_refusal(refused));  // AKID4 is held now: no new read
    REQUIRE(calls == 4);

    // Credentials that cannot be read again (the environment's) are never due.
    d::credential_provider fixed("the environment", {"AKID", "secret", "", std::chrono::system_clock::now() - 1s});
    REQUIRE(!fixed.due());
    REQUIRE(!fixed.reread_after_refusal(fixed.current()));
}

TEST_CASE("credentials: the shared files' profiles: credential_process, assumed roles and their errors", "[credentials]") {
    sluice_test::temp_dir dir;
    const auto script = dir.write("process.sh",
                                  "#!/bin/sh\n"
                                  "echo run >> \"$(dirname \"$0\")/runs\"\n"
                                  "case \"$1\" in\n"
                                  "  ok) echo '{\"Version\": 1, \"AccessKeyId\": \"AKIDPROC\", \"SecretAccessKey\": "
                                  "\"proc-secret\", \"SessionToken\": \"proc-token\", \"Expiration\": \"2099-01-01T00:00:00Z\"}' ;;\n"
                                  "  fail) echo 'process.sh: the vault is sealed (a line of the test script)' >&2; exit 3 ;;\n"
                                  "  junk) echo 'AccessKeyId proc-secret' ;;\n"
                                  "  v2) echo '{\"Version\": 2, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"proc-secret\"}' ;;\n"
                                  "esac\n");
    ::chmod(script.c_str(), 0755);
    const auto config = dir.write(
        "config",
        "[profile proc]\ncredential_process = " + script + " ok --password hunter2\n"
        "[profile proc-fails]\ncredential_process = " + script + " fail --password hunter2\n"
        "[profile proc-junk]\ncredential_process = " + script + " junk\n"
        "[profile proc-v2]\ncredential_process = " + script + " v2\n"
        "[profile lonely-role]\nrole_arn = arn:aws:iam::123456789012:role/r\n"
        "[profile mfa]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = proc\nmfa_serial = arn:aws:iam::1:mfa/me\n"
        "[profile loop-a]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = loop-b\n"
        "[profile loop-b]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = loop-a\n"
        "[profile odd-source]\nrole_arn = arn:aws:iam::123456789012:role/r\ncredential_source = Laptop\n"
        "[profile env-role]\nrole_arn = arn:aws:iam::123456789012:role/r\ncredential_source = Environment\n");
    const auto creds = dir.write("credentials", "[proc]\naws_access_key_id = AKIDFILE\n");  // half a pair: not used
    scoped_env env(bare_env(dir, {{"AWS_CONFIG_FILE", config}, {"AWS_SHARED_CREDENTIALS_FILE", creds}}));

    const auto c = d::resolve_s3({.profile = "proc"}, "s3://b/k");
    REQUIRE(c.creds().access_key == "AKIDPROC");
    REQUIRE(c.creds().session_token == "proc-token");
    REQUIRE(c.creds().expires == d::parse_iso8601("2099-01-01T00:00:00Z"));
    REQUIRE(c.where() == "credential_process of profile [proc]");
    REQUIRE(c.credentials->refreshable());
    REQUIRE(!c.credentials->due());

    auto err = resolve_error({.profile = "proc-fails"});
    REQUIRE(err == "sluice: credential_process of profile [proc-fails] exited with status 3 for 's3://b/k': " +
                       std::make_error_code(std::errc::permission_denied).message());
    REQUIRE(err.find("hunter2") == std::string::npos);  // the command line is not echoed
    err = resolve_error({.profile = "proc-junk"});
    REQUIRE_THAT(err, Catch::StartsWith("sluice: credential_process of profile [proc-junk] printed what is not a JSON object"));
    REQUIRE(err.find("proc-secret") == std::string::npos);
    REQUIRE_THAT(resolve_error({.profile = "proc-v2"}), Catch::Contains("printed JSON without \"Version\": 1"));
    REQUIRE_THAT(resolve_error({.profile = "lonely-role"}),
                 Catch::StartsWith("sluice: profile [lonely-role] has role_arn but no source_profile, credential_source or "
                                   "web_identity_token_file, for 's3://b/k'"));
    REQUIRE_THAT(resolve_error({.profile = "mfa"}), Catch::Contains("profile [mfa] assumes its role with an MFA code"));
    REQUIRE_THAT(resolve_error({.profile = "loop-a"}),
                 Catch::Contains("profile [loop-a]: its source_profile chain loops or is deeper than 5 profiles"));
    REQUIRE_THAT(resolve_error({.profile = "odd-source"}),
                 Catch::Contains("credential_source Laptop (not Environment, Ec2InstanceMetadata or EcsContainer)"));
    REQUIRE_THAT(resolve_error({.profile = "env-role"}),
                 Catch::Contains("profile [env-role]: credential_source Environment, but AWS_ACCESS_KEY_ID is not set"));
    {
        scoped_env web({{"AWS_WEB_IDENTITY_TOKEN_FILE", dir / "token"}});
        REQUIRE_THAT(resolve_error(), Catch::StartsWith("sluice: AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not, for"));
    }
    {
        scoped_env far({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::string("http://user:pw@example.com/creds?sig=x")}});
        err = resolve_error();
        REQUIRE_THAT(err, Catch::Contains("AWS_CONTAINER_CREDENTIALS_FULL_URI must be https, or http to loopback"));
        REQUIRE(err.find("pw") == std::string::npos);
        REQUIRE(err.find("sig=x") == std::string::npos);
    }
    for (const char* refused : {"http://127.evil.example/creds", "http://localhost.evil.example/creds", "http://10.0.0.1/creds"}) {
        scoped_env far({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::string(refused)}});
        INFO(refused);
        REQUIRE_THAT(resolve_error(), Catch::Contains("must be https, or http to loopback"));
    }
    for (const char* allowed : {"http://127.0.0.2:1/c", "http://[::1]:1/c", "http://169.254.170.23/v1/credentials",
                                "http://[fd00:ec2::23]/v1/credentials", "https://creds.example/c"}) {
        scoped_env ok({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", std::string(allowed)}});
        INFO(allowed);
        REQUIRE(d::container_from_env()->url == allowed);  // not contacted
    }
    {
        // ECS gives a path; the host is the task metadata address (not contacted here).
        scoped_env ecs({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", std::string("/v2/credentials/abc")}});
        REQUIRE(d::container_from_env()->url == "http://169.254.170.2/v2/credentials/abc");
    }
}

TEST_CASE("credentials: instance metadata (IMDSv2): 300 objects across several expiries, each exactly once", "[credentials][imds]") {
    sluice_test::temp_dir root, dir;
    const auto want = make_objects(root, 300);
    const std::string secrets = dir / "secrets";
    // Credentials live 2 s (refreshed 0.5 s before); each answer waits 50 ms, 4 at a time:
    // the run takes about 4 s.
    sluice_test::aws_creds_server server(root.path().string(), {"--ttl", "2", "--ttfb-ms", "50", "--secrets", secrets});
    scoped_env env(bare_env(dir, {{"AWS_EC2_METADATA_DISABLED", std::nullopt},
                                  {"AWS_EC2_METADATA_SERVICE_ENDPOINT", server.endpoint()}}));
    sluice::pipeline_figures f;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(read_objects(want, server.endpoint(), &f) == want);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string st = server_stats(server);
    INFO("server: " << st << ", run " << s << " s");
    const auto issued = sluice_test::json_u64(st, "issued");
    REQUIRE(issued >= 3);  // at least 3.75 s of answers: two refreshes, 1.5 s apart
    REQUIRE(issued >= static_cast<std::uint64_t>(s / 2));  // a set per 1.5 s of run
    REQUIRE(counter(f, "fetch", "credential_refreshes") == issued - 1);
    // Refreshed ahead of expiry, not after S3 refused them (which the next case shows):
    // most new credentials came without a refusal.
    const auto refused = sluice_test::json_field(st, "ExpiredToken");
    REQUIRE((refused ? std::stoull(*refused) : 0) * 2 < issued - 1);
    const auto shown = everything_shown(f);
    REQUIRE_THAT(shown, Catch::Contains("\"credentials\":\"instance metadata (IMDSv2 at " + server.endpoint() + ", role sluice-role)\""));
    REQUIRE_THAT(shown, Catch::Contains("    credentials: instance metadata (IMDSv2 at "));
    no_secret_in(shown, secrets);
}

TEST_CASE("credentials: S3's ExpiredToken reads the source again once and retries, nothing lost or repeated",
          "[credentials][imds]") {
    sluice_test::temp_dir root, dir;
    const auto want = make_objects(root, 200);
    const std::string secrets = dir / "secrets";
    // Expiration says an hour, the server stops honouring them after 0.5 s: no refresh is
    // due, S3 answers 400 ExpiredToken, and the stage reads instance metadata again.
    sluice_test::aws_creds_server server(root.path().string(),
                                         {"--ttl", "0.5", "--claimed-ttl", "3600", "--ttfb-ms", "20", "--secrets", secrets});
    scoped_env env(bare_env(dir, {{"AWS_EC2_METADATA_DISABLED", std::nullopt},
                                  {"AWS_EC2_METADATA_SERVICE_ENDPOINT", server.endpoint()}}));
    sluice::pipeline_figures f;
    REQUIRE(read_objects(want, server.endpoint(), &f) == want);
    const std::string st = server_stats(server);
    INFO("server: " << st);
    REQUIRE(sluice_test::json_u64(st, "ExpiredToken") >= 1);
    REQUIRE(sluice_test::json_u64(st, "served") == want.size());
    REQUIRE(counter(f, "fetch", "credential_refreshes") >= 1);
    REQUIRE(counter(f, "fetch", "credential_refreshes") == sluice_test::json_u64(st, "issued") - 1);
    no_secret_in(everything_shown(f), secrets);
}

TEST_CASE("credentials: container credentials with a token file, refreshed, and a wrong token is a clear 401", "[credentials][container]") {
    sluice_test::temp_dir root, dir;
    const auto want = make_objects(root, 160);
    const std::string secrets = dir / "secrets";
    const std::string token = "container-auth-token-0123456789";
    const auto token_file = dir.write("token", token + "\n");
    sluice_test::aws_creds_server server(root.path().string(),
                                         {"--ttl", "1.5", "--ttfb-ms", "40", "--container-token", token, "--secrets", secrets});
    const std::string uri = server.url("container-credentials");
    scoped_env env(bare_env(dir, {{"AWS_CONTAINER_CREDENTIALS_FULL_URI", uri},
                                  {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file}}));
    sluice::pipeline_figures f;
    REQUIRE(read_objects(want, server.endpoint(), &f) == want);
    REQUIRE(counter(f, "fetch", "credential_refreshes") >= 1);
    REQUIRE_THAT(everything_shown(f), Catch::Contains("\"credentials\":\"container credentials (" + uri + ")\""));
    no_secret_in(everything_shown(f), secrets);

    dir.write("token", "wrong-token-9876\n");
    std::string msg;
    try {
        read_objects(want, server.endpoint());
    } catch (const sluice::source_error& e) {
        msg = e.what();
    }
    REQUIRE_THAT(msg, Catch::StartsWith("sluice: container credentials (" + uri + "): HTTP 401 for 's3://bkt/obj-"));
    REQUIRE(msg.find("wrong-token") == std::string::npos);
    REQUIRE(msg.find(token) == std::string::npos);
}

TEST_CASE("credentials: web identity through STS, refreshed, and a refused token names STS and its code, never the token",
          "[credentials][sts]") {
    sluice_test::temp_dir root, dir;
    const auto want = make_objects(root, 160);
    const std::string secrets = dir / "secrets";
    const std::string jwt = "eyJhbGciOiJSUzI1NiJ9.web-identity-test-token.signature";
    const auto token_file = dir.write("token", jwt);
    sluice_test::aws_creds_server server(root.path().string(),
                                         {"--ttl", "1.5", "--ttfb-ms", "40", "--web-token", jwt, "--secrets", secrets});
    scoped_env env(bare_env(dir, {{"AWS_WEB_IDENTITY_TOKEN_FILE", token_file},
                                  {"AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer"},
                                  {"AWS_ENDPOINT_URL_STS", server.endpoint()}}));
    sluice::pipeline_figures f;
    REQUIRE(read_objects(want, server.endpoint(), &f) == want);
    REQUIRE(counter(f, "fetch", "credential_refreshes") >= 1);
    const auto shown = everything_shown(f);
    REQUIRE_THAT(shown, Catch::Contains("\"credentials\":\"web identity (AWS_WEB_IDENTITY_TOKEN_FILE: role "
                                        "arn:aws:iam::123456789012:role/trainer, token file " + token_file +
                                        ", STS at " + server.endpoint() + ")\""));
    REQUIRE(shown.find(jwt) == std::string::npos);
    no_secret_in(shown, secrets);

    dir.write("token", "eyJ.forged.token");
    const auto msg = resolve_error({.endpoint = server.endpoint()});
    REQUIRE_THAT(msg, Catch::StartsWith("sluice: web identity (AWS_WEB_IDENTITY_TOKEN_FILE: role arn:aws:iam::123456789012:role/trainer") &&
                          Catch::Contains("): HTTP 400 InvalidIdentityToken: Couldn't verify the token (RequestId sts-test) from " +
                                          server.endpoint() + " for 's3://b/k'"));
    REQUIRE(msg.find("forged") == std::string::npos);
    dir.write("token", "");
    REQUIRE_THAT(resolve_error({.endpoint = server.endpoint()}), Catch::Contains("the token file " + token_file + " is empty"));
}

TEST_CASE("credentials: instance metadata that refuses names itself and the status, and one that never answers falls through fast",
          "[credentials][imds]") {
    sluice_test::temp_dir root, dir;
    sluice_test::aws_creds_server server(root.path().string(), {"--refuse-role"});
    {
        scoped_env env(bare_env(dir, {{"AWS_EC2_METADATA_DISABLED", std::nullopt},
                                      {"AWS_EC2_METADATA_SERVICE_ENDPOINT", server.endpoint()}}));
        REQUIRE_THAT(resolve_error(), Catch::StartsWith("sluice: instance metadata (IMDSv2 at " + server.endpoint() +
                                                        "): HTTP 401 to the role request for 's3://b/k'"));
    }
    // A host that takes the connection and never answers (a black hole would time out the
    // same way): two tries of 0.3 s, then "no credentials" naming the timeout.
    sluice_test::silent_listener quiet;
    const std::string silent = quiet.url();
    scoped_env env(bare_env(dir, {{"AWS_EC2_METADATA_DISABLED", std::nullopt},
                                  {"AWS_EC2_METADATA_SERVICE_ENDPOINT", silent},
                                  {"AWS_METADATA_SERVICE_TIMEOUT", std::nullopt}}));  // the defaults
    const auto t0 = std::chrono::steady_clock::now();
    const auto msg = resolve_error();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(msg << " after " << s << " s");
    REQUIRE_THAT(msg, Catch::StartsWith("sluice: no AWS credentials (looked in ") &&
                          Catch::Contains("instance metadata (" + silent + ": Timeout was reached"));
    WARN("instance metadata that never answers: the chain gave up after " << s << " s");
    REQUIRE(s < 3.0);  // a generous bound: 2 x 0.3 s plus a pause
}

TEST_CASE("credentials: moto's STS: a profile's role assumed with a signed AssumeRole reads signature-checked S3",
          "[credentials][moto]") {
    SLUICE_SKIP_WITHOUT("moto");
    sluice_test::temp_dir root, dir;
    root.write("data/a.bin", "assumed role's object");
    sluice_test::s3_server moto("moto", root.path().string());
    const auto creds = dir.write("credentials", "[base]\naws_access_key_id = " + moto.key() +
                                                    "\naws_secret_access_key = " + moto.secret() + "\n");
    const auto config = dir.write("config",
                                  "[profile reader]\nrole_arn = " + std::string(sluice_test::s3_server::role_arn) +
                                      "\nsource_profile = base\nrole_session_name = sluice-test\n"
                                      "[profile wrong]\nrole_arn = arn:aws:iam::123456789012:role/no-such-role\n"
                                      "source_profile = base\n");
    scoped_env env(bare_env(dir, {{"AWS_SHARED_CREDENTIALS_FILE", creds},
                                  {"AWS_CONFIG_FILE", config},
                                  {"AWS_ENDPOINT_URL", moto.endpoint()}}));
    sluice::pipeline p(sluice::list("s3://data/a.bin") | sluice::plan() | sluice::fetch({.s3 = {.profile = "reader"}}) | sluice::raw());
    REQUIRE(std::string(p.next_blocking()->data.view()) == "assumed role's object");
    REQUIRE(!p.next_blocking());
    const auto c = d::resolve_s3({.profile = "reader"}, "s3://data/a.bin");
    REQUIRE(c.creds().access_key.starts_with("ASIA"));  // STS's temporary keys
    REQUIRE(c.creds().expires);
    REQUIRE(c.where() == "profile [reader]: role " + std::string(sluice_test::s3_server::role_arn) + " assumed through STS at " +
                             moto.endpoint() + " with " + creds + " [base]");
    // The base keys signed the AssumeRole: a wrong secret is refused by moto's checker.
    dir.write("credentials", "[base]\naws_access_key_id = " + moto.key() + "\naws_secret_access_key = x" + moto.secret() + "\n");
    const auto msg = resolve_error({.profile = "reader"});
    REQUIRE_THAT(msg, Catch::Contains(" [base]: HTTP 403 SignatureDoesNotMatch: ") && Catch::Contains(" from " + moto.endpoint() + " for"));
    REQUIRE(msg.find(moto.secret()) == std::string::npos);
}

TEST_CASE("credentials: moto's STS answers AssumeRoleWithWebIdentity as the chain expects", "[credentials][moto]") {
    SLUICE_SKIP_WITHOUT("moto");
    // moto checks no signature here: under its checker an unsigned AssumeRoleWithWebIdentity
    // (as AWS takes it) fails inside moto. What this shows is that moto's own STS reply
    // reads right and its credentials read its S3.
    sluice_test::temp_dir root, dir;
    root.write("data/w.bin", "web identity's object");
    sluice_test::s3_server moto("moto-open", root.path().string());
    const auto token_file = dir.write("token", "eyJ.moto-web-identity.token");
    scoped_env env(bare_env(dir, {{"AWS_WEB_IDENTITY_TOKEN_FILE", token_file},
                                  {"AWS_ROLE_ARN", sluice_test::s3_server::role_arn},
                                  {"AWS_ENDPOINT_URL", moto.endpoint()}}));
    const auto c = d::resolve_s3({}, "s3://data/w.bin");
    REQUIRE(c.creds().access_key.starts_with("ASIA"));
    REQUIRE(c.creds().expires);
    REQUIRE(*c.creds().expires > std::chrono::system_clock::now() + 10min);
    sluice::pipeline p(sluice::list("s3://data/w.bin") | sluice::plan() | sluice::fetch() | sluice::raw());
    REQUIRE(std::string(p.next_blocking()->data.view()) == "web identity's object");
    REQUIRE_THAT(p.figures().json(), Catch::Contains("\"credentials\":\"web identity (AWS_WEB_IDENTITY_TOKEN_FILE: role "));
}

TEST_CASE("credentials: a stop ends a wait on a credential source that does not answer", "[credentials][stop]") {
    // Container credentials that never answer: two tries of 2 s without a stop.
    sluice_test::temp_dir dir;
    sluice_test::silent_listener quiet;
    scoped_env env(bare_env(dir, {{"AWS_CONTAINER_CREDENTIALS_FULL_URI", quiet.url("/creds")}}));
    sluice::pipeline p(sluice::list("s3://bkt/a.bin") | sluice::plan() |
                       sluice::fetch({.s3 = {.endpoint = "http://127.0.0.1:9"}}) | sluice::raw());
    std::string error;
    std::thread consumer([&] {
        try {
            while (p.next_blocking()) {
            }
        } catch (const std::exception& e) {
            error = e.what();
        }
    });
    std::this_thread::sleep_for(500ms);
    REQUIRE(quiet.has_caller());  // the chain is waiting on it now
    const auto t0 = std::chrono::steady_clock::now();
    p.stop();
    consumer.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("stop took " << s << " s; error: " << error);
    REQUIRE(error.empty());  // a stop, not a failure of the source
    REQUIRE(s < 3.0);  // curl asks about the stop about once a second; 3.5 s more without it
}
