// One test case of gdn_plugin_lifecycle, read from DIR/case.txt (written by tests/plugins/lifecycle_cases.py):
//
//   op GatedDeltaPrefill                 plugin name (= ONNX op type)
//   field gate_mode int 1                node attributes as the ONNX parser passes them (absent: the default)
//   alias 1                              pool (decode, commit): output 'new_state' aliases input 'state' (0: copied)
//   dim T 104 1 256                      a dynamic dimension: value, profile min, profile max
//   input q bfloat16 T,2,64 q.bin        inputs in op order: name, dtype, shape (ints, symbols, symbol+int), data
//   output o bfloat16 T,4,64 o.f64       outputs: name, dtype, shape, float64 reference values
//   tolerance o 0.01                     norm-relative error bound per output (reported, checked by the test)
#pragma once

#include "NvInferRuntime.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gdn
{
namespace lifecycle
{

struct ShapeToken
{
    std::string symbol; // empty: a constant
    int64_t value = 0;  // the constant, or the offset added to the symbol
};

struct TensorSpec
{
    std::string name;
    nvinfer1::DataType type = nvinfer1::DataType::kFLOAT;
    std::vector<ShapeToken> shape;
    std::string file;
};

struct DimRange
{
    int64_t value = 0, min = 0, max = 0;
};

enum class Level
{
    kValue,
    kMin,
    kMax
};

struct LifecycleCase
{
    std::string dir;
    std::string op;
    std::vector<std::pair<std::string, int32_t>> intFields;
    std::vector<std::pair<std::string, float>> floatFields;
    bool aliasState = false;
    std::map<std::string, DimRange> dims;
    std::vector<TensorSpec> inputs;
    std::vector<TensorSpec> outputs;
    std::map<std::string, double> tolerance;

    //! Shape of `t` with every symbol at its value, profile min or profile max.
    nvinfer1::Dims dimsOf(TensorSpec const& t, Level level) const;
    //! Like dimsOf(kValue) with -1 for every symbolic extent (what configurePlugin sees at build time).
    nvinfer1::Dims buildDimsOf(TensorSpec const& t) const;
    //! The symbols bound to their values.
    std::map<std::string, int64_t> sizes() const;
};

//! Parses DIR/case.txt; throws std::runtime_error naming the file and line.
LifecycleCase readCase(std::string const& dir);

size_t elementSize(nvinfer1::DataType t);
char const* dtypeName(nvinfer1::DataType t);
int64_t volume(nvinfer1::Dims const& d);

std::vector<char> readBytes(std::string const& path);
void writeBytes(std::string const& path, void const* data, size_t bytes);

//! Element i of a buffer of type `t` (float32, float16, bfloat16, int32) as a double.
double elementAsDouble(void const* data, nvinfer1::DataType t, int64_t i);

//! ||got - want|| / ||want|| in double (0 when both are zero); NaN when `got` holds a NaN (unwritten element).
double relativeError(void const* got, nvinfer1::DataType t, std::vector<double> const& want);

} // namespace lifecycle
} // namespace gdn
