// What dplb learns of each model's context from the engines' GET /v1/models: the max_model_len of each model
// card, and the longest per cluster, from which a request without max_tokens reserves the rest of its context.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "dplb/upstream/model_context.hpp"

using dplb::upstream::model_context;
using dplb::upstream::model_context_lengths;

namespace {

using lengths = std::vector<std::pair<std::string, std::uint64_t>>;

}  // namespace

TEST_CASE("model context: each model card's max_model_len, as vLLM lists them", "[tenants][model-context]") {
  const std::string vllm = R"({"object":"list","data":[
    {"id":"meta-llama/Llama-3.1-8B","object":"model","created":1,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B",
     "parent":null,"max_model_len":131072,"permission":[{"id":"modelperm-1","allow_sampling":true}]},
    {"id":"sql-lora","object":"model","owned_by":"vllm","root":"x","parent":"meta-llama/Llama-3.1-8B","max_model_len":4096}]})";
  CHECK(model_context_lengths(vllm) == lengths{{"meta-llama/Llama-3.1-8B", 131072}, {"sql-lora", 4096}});
  // Cards without a usable length are left out; what is no models list gives none.
  CHECK(model_context_lengths(R"({"data":[{"id":"a"},{"id":"b","max_model_len":"4096"},{"id":"c","max_model_len":0},
                                           {"id":"d","max_model_len":-5},{"max_model_len":10},{"id":"e","max_model_len":2048}]})") ==
        lengths{{"e", 2048}});
  CHECK(model_context_lengths("").empty());
  CHECK(model_context_lengths("not json").empty());
  CHECK(model_context_lengths(R"({"data":{"id":"a","max_model_len":5}})").empty());
  CHECK(model_context_lengths(R"([{"id":"a","max_model_len":5}])").empty());
  // Nested deeper than any models list: not parsed at all.
  CHECK(model_context_lengths(R"({"data":[{"id":"a","max_model_len":5,"x":)" + std::string(100, '[') +
                              std::string(100, ']') + "}]}")
            .empty());
}

TEST_CASE("model context: a model's length on its cluster, the cluster's longest for a request without a model",
          "[tenants][model-context]") {
  model_context::table t;
  t.by_cluster = {{{"llama", 8192}, {"llama-long", 131072}}, {}, {{"qwen", 32768}}};
  CHECK(t.lookup(0, "llama") == 8192u);
  CHECK(t.lookup(0, "llama-long") == 131072u);
  CHECK(t.lookup(0, "") == 131072u);
  CHECK_FALSE(t.lookup(0, "qwen"));  // another cluster's
  CHECK(t.lookup(2, "qwen") == 32768u);
  CHECK_FALSE(t.lookup(1, ""));  // no engine of the cluster listed one
  CHECK_FALSE(t.lookup(7, "llama"));
}
