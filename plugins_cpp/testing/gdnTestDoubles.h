// Stand-ins for the TensorRT objects a plugin talks to, for the harnesses that drive the gdn plugins without the
// TensorRT library (gdn_plugin_selftest, gdn_plugin_lifecycle): a logger (through ILoggerFinder, as loadLibrary hands
// it over), an error recorder, a resource context (attachToContext) and a symbolic IExprBuilder (getOutputShapes).
// Only the TensorRT headers are used; nothing here is TensorRT code.
#pragma once

#include "NvInferRuntime.h"

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gdn
{
namespace testing
{

//! Counts checks; prints one line per failed one. Used as CHECK(cond) by the harnesses.
struct CheckCounter
{
    int checks = 0;
    int failures = 0;
    void record(bool ok, char const* file, int line, char const* what)
    {
        ++checks;
        if (!ok)
        {
            ++failures;
            std::printf("FAILED %s:%d: %s\n", file, line, what);
        }
    }
};

class CaptureLogger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR)
        {
            errors.emplace_back(msg);
        }
        else if (severity == Severity::kWARNING)
        {
            warnings.emplace_back(msg);
        }
    }
    bool lastErrorHas(char const* needle) const
    {
        return !errors.empty() && errors.back().find(needle) != std::string::npos;
    }
    bool lastWarningHas(char const* needle) const
    {
        return !warnings.empty() && warnings.back().find(needle) != std::string::npos;
    }
    std::vector<std::string> errors;
    std::vector<std::string> warnings;
};

class CaptureFinder : public nvinfer1::ILoggerFinder
{
public:
    nvinfer1::ILogger* findLogger() override
    {
        return &logger;
    }
    CaptureLogger logger;
};

class CaptureRecorder : public nvinfer1::IErrorRecorder
{
public:
    int32_t getNbErrors() const noexcept override
    {
        return static_cast<int32_t>(errors.size());
    }
    nvinfer1::ErrorCode getErrorCode(int32_t /*errorIdx*/) const noexcept override
    {
        return nvinfer1::ErrorCode::kINTERNAL_ERROR;
    }
    ErrorDesc getErrorDesc(int32_t errorIdx) const noexcept override
    {
        return errors[static_cast<size_t>(errorIdx)].c_str();
    }
    bool hasOverflowed() const noexcept override
    {
        return false;
    }
    void clear() noexcept override
    {
        errors.clear();
    }
    bool reportError(nvinfer1::ErrorCode /*val*/, ErrorDesc desc) noexcept override
    {
        errors.emplace_back(desc);
        return true;
    }
    RefCount incRefCount() noexcept override
    {
        return 1;
    }
    RefCount decRefCount() noexcept override
    {
        return 0;
    }
    bool lastHas(char const* needle) const
    {
        return !errors.empty() && errors.back().find(needle) != std::string::npos;
    }
    std::vector<std::string> errors;
};

class FakeResourceContext : public nvinfer1::IPluginResourceContext
{
public:
    nvinfer1::IGpuAllocator* getGpuAllocator() const noexcept override
    {
        return nullptr;
    }
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return recorder;
    }
    nvinfer1::IErrorRecorder* recorder = nullptr;
};

// ---------------------------------------------------------------- symbolic dimension expressions
class SymbolicExpr;

//! One node of a dimension expression: a constant, a named symbol (a dynamic dimension such as T or N+1's N), or
//! an operation on two nodes. Constants fold as TensorRT folds them.
class SymbolicExprNode : public nvinfer1::apiv::VDimensionExpr
{
public:
    bool isConstant() const override
    {
        return symbol.empty() && a == nullptr;
    }
    int64_t getConstantValue() const override
    {
        return isConstant() ? value : INT64_MIN;
    }
    bool isSizeTensor() const override
    {
        return false;
    }
    int64_t value = 0;
    std::string symbol;
    nvinfer1::DimensionOperation op = nvinfer1::DimensionOperation::kSUM;
    SymbolicExpr const* a = nullptr;
    SymbolicExpr const* b = nullptr;
};

class SymbolicExpr : public nvinfer1::IDimensionExpr
{
public:
    SymbolicExpr()
    {
        mImpl = &node;
    }
    ~SymbolicExpr() noexcept override = default;

    //! Value with the symbols bound to `sizes`; false when a symbol is unbound or the operation is not supported.
    bool evaluate(std::map<std::string, int64_t> const& sizes, int64_t& out) const;

    SymbolicExprNode node;
};

class SymbolicExprBuilderImpl : public nvinfer1::apiv::VExprBuilder
{
public:
    nvinfer1::IDimensionExpr const* constant(int64_t value) override;
    nvinfer1::IDimensionExpr const* operation(nvinfer1::DimensionOperation op, nvinfer1::IDimensionExpr const& first,
        nvinfer1::IDimensionExpr const& second) override;
    nvinfer1::IDimensionExpr const* declareSizeTensor(
        int32_t, nvinfer1::IDimensionExpr const&, nvinfer1::IDimensionExpr const&) override
    {
        return nullptr; // the gdn plugins have no data-dependent output shapes
    }
    SymbolicExpr const* symbol(std::string const& name, int64_t offset);

private:
    SymbolicExpr* make();
    std::deque<std::unique_ptr<SymbolicExpr>> mPool;
};

//! IExprBuilder over SymbolicExpr nodes: what TensorRT's builder hands getOutputShapes, with named dynamic dims.
class SymbolicExprBuilder : public nvinfer1::IExprBuilder
{
public:
    SymbolicExprBuilder()
    {
        mImpl = &mBuilder;
    }
    ~SymbolicExprBuilder() noexcept override = default;

    //! `name` + `offset` (e.g. N+1 for cu_seqlens), or a constant when `name` is empty.
    SymbolicExpr const* symbol(std::string const& name, int64_t offset = 0)
    {
        return mBuilder.symbol(name, offset);
    }
    //! Constants for every extent of `d`.
    nvinfer1::DimsExprs constants(nvinfer1::Dims const& d);

private:
    SymbolicExprBuilderImpl mBuilder;
};

//! Value of `e` (an expression of a SymbolicExprBuilder) with the symbols bound to `sizes`; INT64_MIN when unknown.
int64_t evaluate(nvinfer1::IDimensionExpr const* e, std::map<std::string, int64_t> const& sizes);

} // namespace testing
} // namespace gdn

#define GDN_CHECK(counter, cond) (counter).record(static_cast<bool>(cond), __FILE__, __LINE__, #cond)
