// C++ allocations through operator new inside templates, built without frame pointers:
// a vector reserved to 777 ints, a map of 5 nodes, a string of 600 characters, a
// make_unique of a 2000-byte array, each still allocated at exit.
#include <map>
#include <memory>
#include <string>
#include <vector>

template <typename T> struct Holder {
    __attribute__((noinline)) void fill(int n) { items.reserve(n); items.push_back(T()); }
    std::vector<T> items;
};

template <typename K> __attribute__((noinline)) std::map<K, K> *make_map(int n)
{
    auto *m = new std::map<K, K>();
    for (int i = 0; i < n; i++)
        (*m)[K(i)] = K(i);
    return m;
}

__attribute__((noinline)) std::string *make_string(int n) { return new std::string(n, 'x'); }

Holder<int> *holder;   // pointers: no destructor frees them before exit
std::map<long, long> *kept_map;
std::string *kept_string;
char *kept_array;

int main()
{
    holder = new Holder<int>();
    holder->fill(777);
    kept_map = make_map<long>(5);
    kept_string = make_string(600);
    kept_array = std::make_unique<char[]>(2000).release();
    return 0;
}
