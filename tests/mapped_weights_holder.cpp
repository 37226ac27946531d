// A process that holds a model loaded, for mapped_weights_test.cpp: loads tests/abi/mapped.kir's
// library (mapped_f32) with the weights file argv[1], runs both entry points (every weight's
// pages touched), prints "ready" and the first output value, and waits for standard input to
// end before it exits. Exit status 1 and the error when loading or running fails.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "mapped_f32.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mapped_weights_holder WEIGHTS\n");
    return 2;
  }
  try {
    kiln_models::mapped_f32 model(argv[1]);
    kiln::Tensor<float> sums =
        model.column_sums(kiln::Tensor<float>{{1024}, std::vector<float>(1024)});
    kiln::Tensor<int64_t> ids{{4}, {0, 1, 2, 4095}};
    kiln::Tensor<float> y = model.forward(ids);
    std::printf("ready %.9g %.9g\n", sums.data[0], y.data[0]);
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mapped_weights_holder: %s\n", e.what());
    return 1;
  }
  return 0;
}
