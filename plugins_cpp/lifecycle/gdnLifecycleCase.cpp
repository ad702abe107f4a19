#include "gdnLifecycleCase.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>

using namespace nvinfer1;

namespace gdn
{
namespace lifecycle
{
namespace
{
DataType parseType(std::string const& s)
{
    if (s == "float32")
        return DataType::kFLOAT;
    if (s == "float16")
        return DataType::kHALF;
    if (s == "bfloat16")
        return DataType::kBF16;
    if (s == "int32")
        return DataType::kINT32;
    throw std::runtime_error("unknown dtype '" + s + "'");
}

std::vector<ShapeToken> parseShape(std::string const& s)
{
    std::vector<ShapeToken> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
    {
        ShapeToken t;
        size_t const plus = item.find('+');
        std::string const head = item.substr(0, plus);
        if (!head.empty() && (std::isdigit(static_cast<unsigned char>(head[0])) != 0))
        {
            t.value = std::stoll(head);
        }
        else
        {
            t.symbol = head;
            t.value = plus == std::string::npos ? 0 : std::stoll(item.substr(plus + 1));
        }
        out.push_back(t);
    }
    return out;
}

float halfToFloat(uint16_t h)
{
    uint32_t const sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits = 0;
    if (exp == 0x1F)
    {
        bits = sign | 0x7F800000u | (mant << 13); // inf / NaN
    }
    else if (exp != 0)
    {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    else if (mant != 0)
    {
        exp = 113; // subnormal: normalise
        while ((mant & 0x400u) == 0)
        {
            mant <<= 1;
            --exp;
        }
        bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
    else
    {
        bits = sign;
    }
    float f = 0.f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}
} // namespace

Dims LifecycleCase::dimsOf(TensorSpec const& t, Level level) const
{
    Dims d{};
    d.nbDims = static_cast<int32_t>(t.shape.size());
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        ShapeToken const& tok = t.shape[static_cast<size_t>(i)];
        if (tok.symbol.empty())
        {
            d.d[i] = tok.value;
            continue;
        }
        DimRange const& r = dims.at(tok.symbol);
        d.d[i] = (level == Level::kValue ? r.value : level == Level::kMin ? r.min : r.max) + tok.value;
    }
    return d;
}

Dims LifecycleCase::buildDimsOf(TensorSpec const& t) const
{
    Dims d = dimsOf(t, Level::kValue);
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        if (!t.shape[static_cast<size_t>(i)].symbol.empty())
        {
            d.d[i] = -1;
        }
    }
    return d;
}

std::map<std::string, int64_t> LifecycleCase::sizes() const
{
    std::map<std::string, int64_t> out;
    for (auto const& kv : dims)
    {
        out[kv.first] = kv.second.value;
    }
    return out;
}

LifecycleCase readCase(std::string const& dir)
{
    std::string const path = dir + "/case.txt";
    std::ifstream in(path);
    if (!in)
    {
        throw std::runtime_error(path + ": cannot open");
    }
    LifecycleCase c;
    c.dir = dir;
    std::string line;
    int lineNo = 0;
    while (std::getline(in, line))
    {
        ++lineNo;
        std::stringstream ss(line);
        std::string key;
        if (!(ss >> key) || key[0] == '#')
        {
            continue;
        }
        try
        {
            if (key == "op")
            {
                ss >> c.op;
            }
            else if (key == "field")
            {
                std::string name, kind, value;
                ss >> name >> kind >> value;
                if (kind == "int")
                    c.intFields.emplace_back(name, static_cast<int32_t>(std::stol(value)));
                else if (kind == "float")
                    c.floatFields.emplace_back(name, std::stof(value));
                else
                    throw std::runtime_error("field kind must be int or float");
            }
            else if (key == "alias")
            {
                int v = 0;
                ss >> v;
                c.aliasState = v != 0;
            }
            else if (key == "dim")
            {
                std::string name;
                DimRange r;
                ss >> name >> r.value >> r.min >> r.max;
                c.dims[name] = r;
            }
            else if (key == "input" || key == "output")
            {
                TensorSpec t;
                std::string type, shape;
                ss >> t.name >> type >> shape >> t.file;
                t.type = parseType(type);
                t.shape = parseShape(shape);
                (key == "input" ? c.inputs : c.outputs).push_back(t);
            }
            else if (key == "tolerance")
            {
                std::string name;
                double tol = 0;
                ss >> name >> tol;
                c.tolerance[name] = tol;
            }
            else
            {
                throw std::runtime_error("unknown key '" + key + "'");
            }
            if (ss.fail())
            {
                throw std::runtime_error("malformed line");
            }
        }
        catch (std::exception const& e)
        {
            throw std::runtime_error(path + ":" + std::to_string(lineNo) + ": " + e.what());
        }
    }
    if (c.op.empty() || c.inputs.empty() || c.outputs.empty())
    {
        throw std::runtime_error(path + ": needs op, inputs and outputs");
    }
    return c;
}

size_t elementSize(DataType t)
{
    switch (t)
    {
    case DataType::kHALF:
    case DataType::kBF16: return 2;
    default: return 4;
    }
}

char const* dtypeName(DataType t)
{
    switch (t)
    {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kBF16: return "bfloat16";
    case DataType::kINT32: return "int32";
    default: return "other";
    }
}

int64_t volume(Dims const& d)
{
    int64_t v = 1;
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        v *= d.d[i];
    }
    return v;
}

std::vector<char> readBytes(std::string const& path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
    {
        throw std::runtime_error(path + ": cannot open");
    }
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void writeBytes(std::string const& path, void const* data, size_t bytes)
{
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<char const*>(data), static_cast<std::streamsize>(bytes));
    if (!out)
    {
        throw std::runtime_error(path + ": cannot write");
    }
}

double elementAsDouble(void const* data, DataType t, int64_t i)
{
    switch (t)
    {
    case DataType::kFLOAT: return static_cast<float const*>(data)[i];
    case DataType::kINT32: return static_cast<int32_t const*>(data)[i];
    case DataType::kHALF: return halfToFloat(static_cast<uint16_t const*>(data)[i]);
    case DataType::kBF16:
    {
        uint32_t const bits = static_cast<uint32_t>(static_cast<uint16_t const*>(data)[i]) << 16;
        float f = 0.f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
    }
    default: return std::numeric_limits<double>::quiet_NaN();
    }
}

double relativeError(void const* got, DataType t, std::vector<double> const& want)
{
    double num = 0.0;
    double den = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
    {
        double const g = elementAsDouble(got, t, static_cast<int64_t>(i));
        if (std::isnan(g))
        {
            return std::numeric_limits<double>::quiet_NaN();
        }
        num += (g - want[i]) * (g - want[i]);
        den += want[i] * want[i];
    }
    if (den == 0.0)
    {
        return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
    }
    return std::sqrt(num / den);
}

} // namespace lifecycle
} // namespace gdn
