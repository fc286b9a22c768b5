#include <railshard.h>

#include <cstdio>
#include <vector>

int main() {
  auto comm = railshard::init();
  std::vector<float> data(1000, 1.0f);
  comm->allreduce(data.data(), data.size(), railshard::DataType::kFloat32, railshard::ReduceOp::kSum);
  for (float v : data) {
    if (v != static_cast<float>(comm->size())) return 1;
  }
  std::printf("consumer rank %d of %d ok\n", comm->rank(), comm->size());
  return 0;
}
