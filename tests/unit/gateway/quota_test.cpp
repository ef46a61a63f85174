// Every quota limit against a manual clock: GCRA requests/min, the tokens/min bucket with its
// refunds, max concurrent, the daily budget and its UTC reset, max tokens per request; and the
// headers and 429 bodies a decision becomes.
#include <doctest/doctest.h>

#include <limits>

#include <boost/json/parse.hpp>

#include <chrono>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "quota_phases.h"
#include "tenancy/quota_rules.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

// 2026-05-01T12:00:00Z: noon, so a day boundary is 12 h away.
const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));

gw::quota_decision ask(gw::quota_store& store, const gw::tenant_quotas& q, std::int64_t prompt, std::int64_t max_tokens,
                       std::string_view tenant = "acme") {
  return edge::testing::admit_and_reserve(store, q, prompt, max_tokens, tenant);
}

}  // namespace

TEST_CASE("requests per minute: GCRA allows the minute's worth at once, then one per interval") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 3;  // one every 20 s

  for (std::int64_t expected_remaining : {2, 1, 0}) {
    const auto d = ask(store, q, 1, 1);
    REQUIRE(d.allowed);
    REQUIRE(d.requests);
    CHECK(d.requests->limit == 3);
    CHECK(d.requests->remaining == expected_remaining);
    CHECK_FALSE(d.tokens);  // tokens/min is unlimited: no token headers
  }
  CHECK(ask(store, q, 1, 1).requests->reset == 60s);  // refused, but says when all 3 are back

  auto refused = ask(store, q, 1, 1);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.limit == gw::quota_limit::requests_per_minute);
  REQUIRE(refused.retry_after);
  CHECK(*refused.retry_after == 20s);
  CHECK(refused.requests->remaining == 0);
  CHECK(refused.message.find("requests per minute") != std::string::npos);

  clock.advance(20s - 1ms);
  CHECK_FALSE(ask(store, q, 1, 1).allowed);
  clock.advance(1ms);
  auto again = ask(store, q, 1, 1);
  CHECK(again.allowed);
  CHECK(again.requests->remaining == 0);
  CHECK_FALSE(ask(store, q, 1, 1).allowed);

  // A quiet minute restores the whole burst.
  clock.advance(60s);
  for (int i = 0; i < 3; ++i) CHECK(ask(store, q, 1, 1).allowed);
  CHECK_FALSE(ask(store, q, 1, 1).allowed);
}

TEST_CASE("requests per minute: a steady rate at the limit is never refused") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 600;  // one every 100 ms
  for (int i = 0; i < 2000; ++i) {
    REQUIRE(ask(store, q, 1, 1).allowed);
    clock.advance(100ms);
  }
}

TEST_CASE("tokens per minute: prompt + max_tokens is reserved, the unused part refunded") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.tokens_per_minute = 1200;  // 20 tokens per second

  auto first = ask(store, q, 100, 500);
  REQUIRE(first.allowed);
  CHECK(first.reservation.bucket_tokens == 600);
  REQUIRE(first.tokens);
  CHECK(first.tokens->limit == 1200);
  CHECK(first.tokens->remaining == 600);
  CHECK(first.tokens->reset == 30s);  // 600 tokens at 20/s

  auto second = ask(store, q, 100, 500);
  REQUIRE(second.allowed);
  CHECK(second.tokens->remaining == 0);

  auto third = ask(store, q, 100, 500);
  CHECK_FALSE(third.allowed);
  CHECK(third.limit == gw::quota_limit::tokens_per_minute);
  REQUIRE(third.retry_after);
  CHECK(*third.retry_after == 30s);  // 600 missing at 20/s
  CHECK(third.message.find("tokens per minute") != std::string::npos);

  // The first request used 100 + 150 of its 600: 350 come back.
  store.settle(first.reservation, 250);
  auto fourth = ask(store, q, 100, 200);
  REQUIRE(fourth.allowed);
  CHECK(fourth.tokens->remaining == 50);

  // Refills at 20 tokens per second.
  clock.advance(10s);
  auto fifth = ask(store, q, 0, 250);
  REQUIRE(fifth.allowed);
  CHECK(fifth.tokens->remaining == 0);
}

TEST_CASE("tokens per minute: a refund never fills the bucket past its limit") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.tokens_per_minute = 600;
  auto d = ask(store, q, 100, 100);
  REQUIRE(d.allowed);
  clock.advance(10min);
  CHECK(ask(store, q, 0, 1).tokens->remaining == 599);  // refilled to the top meanwhile
  store.settle(d.reservation, 0);                        // 200 more would overflow it
  CHECK(ask(store, q, 0, 1).tokens->remaining == 599);
}

TEST_CASE("tokens per minute: a request larger than the whole limit is refused for good") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.tokens_per_minute = 1000;
  auto d = ask(store, q, 200, 900);
  CHECK_FALSE(d.allowed);
  CHECK(d.limit == gw::quota_limit::tokens_per_minute);
  CHECK_FALSE(d.retry_after);  // waiting cannot help
  CHECK(d.message.find("Request too large") != std::string::npos);
  CHECK(ask(store, q, 200, 800).allowed);  // and it took nothing
}

TEST_CASE("a lowered tokens-per-minute limit takes effect at once") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.tokens_per_minute = 10000;
  REQUIRE(ask(store, q, 0, 1).allowed);
  q.tokens_per_minute = 100;
  auto d = ask(store, q, 0, 50);
  REQUIRE(d.allowed);
  CHECK(d.tokens->remaining == 50);
}

TEST_CASE("max concurrent: a slot is held from admission until release") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.max_concurrent = 2;
  auto a = ask(store, q, 1, 1);
  auto b = ask(store, q, 1, 1);
  REQUIRE(a.allowed);
  REQUIRE(b.allowed);
  CHECK(store.in_flight("acme") == 2);
  auto c = ask(store, q, 1, 1);
  CHECK_FALSE(c.allowed);
  CHECK(c.limit == gw::quota_limit::max_concurrent);
  REQUIRE(c.retry_after);
  CHECK(*c.retry_after == 1s);
  // Another tenant has its own slots.
  CHECK(ask(store, q, 1, 1, "other-tenant").allowed);

  store.release(a.reservation);
  CHECK(store.in_flight("acme") == 1);
  CHECK(ask(store, q, 1, 1).allowed);
}

TEST_CASE("daily budget: reserved at admission, refunded, and renewed at 00:00 UTC") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.daily_tokens = 1000;

  auto a = ask(store, q, 100, 700);
  REQUIRE(a.allowed);
  CHECK(store.day_tokens_used("acme") == 800);
  auto refused = ask(store, q, 100, 200);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.limit == gw::quota_limit::daily_tokens);
  REQUIRE(refused.retry_after);
  CHECK(*refused.retry_after == 12h);  // until midnight UTC
  CHECK(refused.message.find("2026-05-02T00:00:00Z") != std::string::npos);

  // Only 100 + 300 were used: 400 come back to today's budget.
  store.settle(a.reservation, 400);
  CHECK(store.day_tokens_used("acme") == 400);
  auto b = ask(store, q, 100, 500);
  REQUIRE(b.allowed);
  store.settle(b.reservation, 600);
  CHECK(store.day_tokens_used("acme") == 1000);
  CHECK_FALSE(ask(store, q, 1, 0).allowed);

  clock.advance(12h - 1s);
  CHECK_FALSE(ask(store, q, 1, 0).allowed);
  clock.advance(1s);  // 2026-05-02T00:00:00Z
  auto next_day = ask(store, q, 100, 800);
  CHECK(next_day.allowed);
  CHECK(store.day_tokens_used("acme") == 900);
}

TEST_CASE("daily budget: a refund after midnight does not touch the new day") {
  edge::manual_time_source clock(noon + 12h - 1min);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.daily_tokens = 1000;
  auto late = ask(store, q, 0, 900);
  REQUIRE(late.allowed);
  clock.advance(2min);
  auto early = ask(store, q, 0, 500);
  REQUIRE(early.allowed);
  store.settle(late.reservation, 0);
  CHECK(store.day_tokens_used("acme") == 500);
}

TEST_CASE("daily budget: seeded usage (from the ledger at start) counts") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.daily_tokens = 1000;
  store.seed_day_tokens("acme", 950);
  CHECK_FALSE(ask(store, q, 10, 41).allowed);
  CHECK(ask(store, q, 10, 40).allowed);
}

TEST_CASE("daily budget: a request larger than the whole budget is refused for good") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.daily_tokens = 100;
  auto d = ask(store, q, 50, 51);
  CHECK_FALSE(d.allowed);
  CHECK_FALSE(d.retry_after);
}

TEST_CASE("max tokens per request bounds max_tokens, not the prompt") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.max_tokens_per_request = 4096;
  CHECK(ask(store, q, 10000, 4096).allowed);
  auto d = ask(store, q, 1, 4097);
  CHECK_FALSE(d.allowed);
  CHECK(d.limit == gw::quota_limit::max_tokens_per_request);
  CHECK_FALSE(d.retry_after);
  CHECK(d.message.find("4097") != std::string::npos);
}

TEST_CASE("a refused request takes nothing from the limits of the phase that refused it") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 3;
  q.tokens_per_minute = 1000;
  q.max_concurrent = 5;
  q.daily_tokens = 100000;

  // Refused by tokens (phase 2): the bucket, the budget and, once finished, the slot are
  // untouched; the requests count.
  for (int i = 0; i < 2; ++i) CHECK_FALSE(ask(store, q, 0, 1001).allowed);
  CHECK(store.in_flight("acme") == 0);
  CHECK(store.day_tokens_used("acme") == 0);
  auto a = ask(store, q, 0, 400);
  REQUIRE(a.allowed);
  CHECK(a.requests->remaining == 0);
  CHECK(a.tokens->remaining == 600);

  // Refused by requests (phase 1): the concurrency slots stay as they were.
  auto refused = store.try_admit({"acme", q, "late"});
  CHECK_FALSE(refused.allowed);
  CHECK(refused.limit == gw::quota_limit::requests_per_minute);
  CHECK(store.in_flight("acme") == 1);
  CHECK(store.day_tokens_used("acme") == 400);
}

TEST_CASE("phase 1 judges requests/min and concurrency before the prompt is known; a body refused later still counts") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 1;
  q.max_tokens_per_request = 100;

  const auto admitted = store.try_admit({"acme", q, "first"});
  REQUIRE(admitted.allowed);
  REQUIRE(admitted.requests);
  CHECK(admitted.requests->remaining == 0);
  CHECK_FALSE(admitted.tokens);  // tokens are phase 2's
  CHECK(admitted.reservation.id == "first");
  CHECK_FALSE(admitted.reservation.holds_slot);

  const auto body = store.try_reserve(admitted.reservation, {"acme", q, 10, 4000});
  CHECK_FALSE(body.allowed);
  CHECK(body.limit == gw::quota_limit::max_tokens_per_request);
  CHECK_FALSE(body.requests);
  store.finish(admitted.reservation, 0);

  // The refused request was a request: the next one waits its turn, before any body is read.
  const auto next = store.try_admit({"acme", q, "second"});
  CHECK_FALSE(next.allowed);
  CHECK(next.limit == gw::quota_limit::requests_per_minute);
  CHECK(next.retry_after == std::optional<std::chrono::milliseconds>(60s));
  clock.advance(60s);
  CHECK(store.try_admit({"acme", q, "third"}).allowed);
}

TEST_CASE("phase 2 adds the tokens to what phase 1 holds; refused, it leaves the slot held until finish") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.max_concurrent = 1;
  q.tokens_per_minute = 1000;
  q.daily_tokens = 5000;

  const auto admitted = store.try_admit({"acme", q, "a"});
  REQUIRE(admitted.allowed);
  CHECK_FALSE(admitted.requests);  // requests/min is unlimited
  CHECK(admitted.reservation.holds_slot);
  CHECK(store.in_flight("acme") == 1);

  const auto too_big = store.try_reserve(admitted.reservation, {"acme", q, 1, 1000});
  CHECK_FALSE(too_big.allowed);
  CHECK(too_big.limit == gw::quota_limit::tokens_per_minute);
  CHECK_FALSE(too_big.retry_after);
  REQUIRE(too_big.tokens);
  CHECK(too_big.tokens->remaining == 1000);
  CHECK(store.in_flight("acme") == 1);  // the caller still holds phase 1
  CHECK(store.day_tokens_used("acme") == 0);
  CHECK(store.try_admit({"acme", q, "b"}).limit == gw::quota_limit::max_concurrent);

  const auto reserved = store.try_reserve(admitted.reservation, {"acme", q, 100, 400});
  REQUIRE(reserved.allowed);
  CHECK(reserved.reservation.tenant_id == "acme");
  CHECK(reserved.reservation.id == "a");
  CHECK(reserved.reservation.holds_slot);
  CHECK(reserved.reservation.bucket_tokens == 500);
  CHECK(reserved.reservation.day_tokens == 500);
  REQUIRE(reserved.tokens);
  CHECK(reserved.tokens->remaining == 500);
  CHECK_FALSE(reserved.requests);
  CHECK(store.day_tokens_used("acme") == 500);

  store.finish(reserved.reservation, 200);
  CHECK(store.in_flight("acme") == 0);
  CHECK(store.day_tokens_used("acme") == 200);
  CHECK(store.try_admit({"acme", q, "c"}).allowed);
}

TEST_CASE("within a phase the first refusal in order is reported, and retry-after is the longest wait") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 1;
  q.max_concurrent = 1;
  q.max_tokens_per_request = 100;
  q.daily_tokens = 1000;
  q.tokens_per_minute = 600;

  // Phase 1: max_concurrent before requests_per_minute; the minute is the longer wait.
  const auto held = store.try_admit({"acme", q, "held"});
  REQUIRE(held.allowed);
  const auto both = store.try_admit({"acme", q, "both"});
  CHECK(both.limit == gw::quota_limit::max_concurrent);
  CHECK(both.retry_after == std::optional<std::chrono::milliseconds>(60s));
  CHECK(both.message.find("Too many concurrent requests") != std::string::npos);

  // Phase 2: max_tokens_per_request, then daily_tokens, then tokens_per_minute.
  const auto spent = store.try_reserve(held.reservation, {"acme", q, 450, 100});
  REQUIRE(spent.allowed);  // 550 of the day, 50 left in the bucket
  const auto day_and_bucket = store.try_reserve(held.reservation, {"acme", q, 400, 100});
  CHECK(day_and_bucket.limit == gw::quota_limit::daily_tokens);
  CHECK(day_and_bucket.retry_after == std::optional<std::chrono::milliseconds>(12h));  // midnight, not the bucket's 45 s
  const auto never = store.try_reserve(held.reservation, {"acme", q, 400, 101});
  CHECK(never.limit == gw::quota_limit::max_tokens_per_request);
  CHECK_FALSE(never.retry_after);  // one of them can never pass
  CHECK(store.day_tokens_used("acme") == 550);
}

TEST_CASE("retry-after is the longest wait among the limits that refused") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 1;     // next request in 60 s
  q.tokens_per_minute = 600;     // 10 per second
  REQUIRE(ask(store, q, 0, 100).allowed);
  auto d = ask(store, q, 0, 550);  // tokens need 5 s, requests need 60 s
  CHECK_FALSE(d.allowed);
  CHECK(d.limit == gw::quota_limit::requests_per_minute);
  CHECK(*d.retry_after == 60s);
}

TEST_CASE("without limits everything is admitted and nothing is counted") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  const gw::tenant_quotas unlimited;
  for (int i = 0; i < 100; ++i) {
    auto d = ask(store, unlimited, 100000, 100000);
    REQUIRE(d.allowed);
    CHECK_FALSE(d.requests);
    CHECK_FALSE(d.tokens);
    CHECK_FALSE(d.reservation.holds_slot);
  }
  CHECK(store.in_flight("acme") == 0);
}

TEST_CASE("reservation ids differ between calls and between gateways") {
  gw::reservation_ids first_gateway, second_gateway;
  const std::string a = first_gateway.next();
  const std::string b = first_gateway.next();
  const std::string c = second_gateway.next();
  CHECK(a != b);
  CHECK(a != c);  // each gateway draws its own prefix
  CHECK(b != c);
}

TEST_CASE("reset durations are written as OpenAI writes them") {
  CHECK(gw::format_reset_duration(0ms) == "0s");
  CHECK(gw::format_reset_duration(20ms) == "20ms");
  CHECK(gw::format_reset_duration(1s) == "1s");
  CHECK(gw::format_reset_duration(1500ms) == "1.5s");
  CHECK(gw::format_reset_duration(6min) == "6m0s");
  CHECK(gw::format_reset_duration(1h + 2min + 3s + 250ms) == "1h2m3.25s");
  CHECK(gw::format_reset_duration(61005ms) == "1m1.005s");
}

TEST_CASE("a decision becomes x-ratelimit headers and, refused, a 429 with retry-after") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.requests_per_minute = 1;
  q.tokens_per_minute = 6000;

  auto allowed = ask(store, q, 10, 90);
  REQUIRE(allowed.allowed);
  gw::response ok{gw::http::status::ok, 11};
  gw::set_rate_limit_headers(ok, allowed);
  CHECK(ok["x-ratelimit-limit-requests"] == "1");
  CHECK(ok["x-ratelimit-remaining-requests"] == "0");
  CHECK(ok["x-ratelimit-reset-requests"] == "1m0s");
  CHECK(ok["x-ratelimit-limit-tokens"] == "6000");
  CHECK(ok["x-ratelimit-remaining-tokens"] == "5900");
  CHECK(ok["x-ratelimit-reset-tokens"] == "1s");
  CHECK(ok.find(gw::http::field::retry_after) == ok.end());

  clock.advance(59500ms);
  auto refused = ask(store, q, 10, 90);
  REQUIRE_FALSE(refused.allowed);
  const gw::response res = gw::quota_refusal_response(refused);
  CHECK(res.result() == gw::http::status::too_many_requests);
  CHECK(res[gw::http::field::retry_after] == "1");  // 500 ms rounds up to a whole second
  CHECK(res["retry-after-ms"] == "500");
  CHECK(res["x-ratelimit-remaining-requests"] == "0");
  const auto body = boost::json::parse(res.body()).as_object().at("error").as_object();
  CHECK(body.at("type") == "requests");
  CHECK(body.at("code") == "rate_limit_exceeded");
  CHECK(body.at("param").is_null());
}

TEST_CASE("refusal bodies: tokens, insufficient_quota, and max_tokens as a 400") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  const auto error_of = [](const gw::response& res) {
    return boost::json::parse(res.body()).as_object().at("error").as_object();
  };

  gw::tenant_quotas tokens;
  tokens.tokens_per_minute = 100;
  REQUIRE(ask(store, tokens, 0, 100).allowed);
  auto by_tokens = gw::quota_refusal_response(ask(store, tokens, 0, 50));
  CHECK(by_tokens.result() == gw::http::status::too_many_requests);
  CHECK(error_of(by_tokens).at("type") == "tokens");
  CHECK(error_of(by_tokens).at("code") == "rate_limit_exceeded");
  CHECK(by_tokens["retry-after-ms"] == "30000");

  gw::tenant_quotas daily;
  daily.daily_tokens = 10;
  auto spent = gw::quota_refusal_response(ask(store, daily, 5, 6, "budget"));
  CHECK(spent.result() == gw::http::status::too_many_requests);
  CHECK(error_of(spent).at("type") == "insufficient_quota");
  CHECK(error_of(spent).at("code") == "insufficient_quota");
  CHECK(spent.find(gw::http::field::retry_after) == spent.end());  // more than the whole budget

  gw::tenant_quotas per_request;
  per_request.max_tokens_per_request = 10;
  auto too_many = gw::quota_refusal_response(ask(store, per_request, 1, 11, "small"));
  CHECK(too_many.result() == gw::http::status::bad_request);
  CHECK(error_of(too_many).at("param") == "max_tokens");
  CHECK(error_of(too_many).at("type") == "invalid_request_error");
}

TEST_CASE("a request for n choices reserves prompt + n x max_tokens and refunds what its choices left") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.tokens_per_minute = 1000;
  q.daily_tokens = 5000;
  q.max_tokens_per_request = 300;  // per choice

  const auto three = edge::testing::admit_and_reserve(store, q, 100, 200, "acme", 3);
  REQUIRE(three.allowed);
  CHECK(three.reservation.bucket_tokens == 700);
  CHECK(three.reservation.day_tokens == 700);
  REQUIRE(three.tokens);
  CHECK(three.tokens->remaining == 300);
  CHECK(store.day_tokens_used("acme") == 700);

  // 4 x 100 more would overrun the bucket: refused, saying why, and nothing taken.
  const auto four = edge::testing::admit_and_reserve(store, q, 0, 100, "acme", 4);
  CHECK_FALSE(four.allowed);
  CHECK(four.limit == gw::quota_limit::tokens_per_minute);
  CHECK(store.day_tokens_used("acme") == 700);
  // More than a minute's worth on its own: the message names the choices.
  const auto never = edge::testing::admit_and_reserve(store, q, 100, 300, "acme", 4);
  CHECK_FALSE(never.allowed);
  CHECK_FALSE(never.retry_after);
  CHECK(never.message.find("4 choices × max_tokens 300") != std::string::npos);
  CHECK(never.message.find("or n") != std::string::npos);

  // The choices used 100 + 250 of the 700: 350 come back to the bucket and the day.
  store.finish(three.reservation, 350);
  CHECK(store.day_tokens_used("acme") == 350);
  const auto after = edge::testing::admit_and_reserve(store, q, 0, 100, "acme", 6);
  REQUIRE(after.allowed);
  REQUIRE(after.tokens);
  CHECK(after.tokens->remaining == 50);
  // max_tokens_per_request bounds each choice, not their sum.
  CHECK(edge::testing::admit_and_reserve(store, q, 0, 301, "acme", 1).limit == gw::quota_limit::max_tokens_per_request);
  // A count no request could hold is capped, not overflowed.
  const gw::quota_request huge{"acme", q, 5, std::numeric_limits<std::int64_t>::max(), 100};
  CHECK(huge.cost() > 0);
  CHECK(huge.completion_tokens() == std::numeric_limits<std::int64_t>::max() / 2);
}

TEST_CASE("UTC calendar months: numbered from 1970-01, starting on the 1st at 00:00") {
  namespace rules = gw::quota_rules;
  CHECK(rules::utc_month(0) == 0);
  CHECK(rules::month_start(0) == 0);
  CHECK(rules::utc_month(1777636800) == (2026 - 1970) * 12 + 4);  // 2026-05-01T12:00Z
  CHECK(gw::format_utc(rules::month_start(rules::utc_month(1777636800))) == "2026-05-01T00:00:00Z");
  // December to January, and February of a leap year.
  const std::int64_t december = (2026 - 1970) * 12 + 11;
  CHECK(gw::format_utc(rules::month_start(december + 1)) == "2027-01-01T00:00:00Z");
  CHECK(rules::utc_month(rules::month_start(december + 1) - 1) == december);
  const std::int64_t february_2028 = (2028 - 1970) * 12 + 1;
  CHECK(rules::month_start(february_2028 + 1) - rules::month_start(february_2028) == 29 * 86400);
  CHECK(rules::utc_month(-1) == -1);  // 1969-12
  CHECK(gw::format_utc(rules::month_start(-1)) == "1969-12-01T00:00:00Z");
}

TEST_CASE("monthly budget: reserved, refunded, said when it resets, and renewed on the 1st at 00:00 UTC") {
  edge::manual_time_source clock(noon + 30 * 24h + 11h);  // 2026-05-31T23:00Z
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas q;
  q.monthly_tokens = 1000;
  q.daily_tokens = 5000;  // both budgets take; the monthly one refuses first

  auto a = ask(store, q, 100, 700);
  REQUIRE(a.allowed);
  CHECK(a.reservation.month_tokens == 800);
  CHECK(a.reservation.budget_tokens() == 800);
  CHECK(store.month_tokens_used("acme") == 800);
  auto refused = ask(store, q, 100, 200);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.limit == gw::quota_limit::monthly_tokens);
  REQUIRE(refused.retry_after);
  CHECK(*refused.retry_after == 1h);
  CHECK(refused.message.find("800 of 1000 tokens spent or reserved this month") != std::string::npos);
  CHECK(refused.message.find("2026-06-01T00:00:00Z") != std::string::npos);
  CHECK_FALSE(ask(store, q, 600, 600).retry_after);  // larger than the whole budget: refused for good

  store.settle(a.reservation, 400);
  CHECK(store.month_tokens_used("acme") == 400);
  // A request without max_tokens gets at most what the whole budget allows, as with the daily one.
  CHECK(gw::quota_rules::default_max_tokens(q, 100, 100000, 1) == 900);

  auto late = ask(store, q, 0, 500);
  REQUIRE(late.allowed);
  clock.advance(1h);  // 2026-06-01T00:00Z: a new month
  auto june = ask(store, q, 100, 800);
  CHECK(june.allowed);
  store.settle(late.reservation, 0);  // May's refund does not touch June
  CHECK(store.month_tokens_used("acme") == 900);

  store.seed_month_tokens("acme", 100);
  CHECK_FALSE(ask(store, q, 0, 1).allowed);
}
