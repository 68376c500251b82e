#include <sluice/sluice.hpp>

#include <iostream>

int main() {
    auto squares = sluice::from<int>({1, 2, 3, 4}) | sluice::map([](int x) { return x * x; });
    int sum = 0;
    for (int v : sluice::pipeline(squares)) sum += v;
    std::cout << "sum " << sum << "\n";
    return sum == 30 ? 0 : 1;
}
